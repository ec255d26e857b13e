"""The planning loop against a scripted OpenAI-compatible server: streaming admission, repair, re-planning.

Every test runs on the virtual clock: the model's token pace, the tools' sleeps and the deadlines are virtual, so
"the first step starts 0.3 s before the plan is written" holds exactly, however busy the machine is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.engine.runtime import RunResult
from planweave.models import Budget
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.timing import on_virtual_clock


def purpose(req: RecordedRequest) -> str:
    text = " ".join(str(m.get("content", "")) for m in req.messages)
    if "If the results answer the goal" in text:
        return "join"
    if "failed for good" in text:
        return "repair"
    if "REMAINING plan" in text:
        return "replan"
    if "were rejected" in text:
        return "fix"
    return "plan"


def tools_with(calls: list[str]) -> Toolbox:
    box = builtin_tools()

    async def fetch(city: str, fail: bool = False) -> dict[str, Any]:
        """Fetch the weather of a city."""
        calls.append(city)
        await asyncio.sleep(0.05)
        if fail:
            raise ConnectionError(f"{city} is down")
        return {"city": city, "temp": len(city) * 3}

    box.add(fetch, idempotent=True)
    return box


async def run_goal(script: Callable[[RecordedRequest], Reply], tools: Toolbox, *, tps: float | None = None,
                   options: PlanningOptions | None = None, budget: Budget | None = None,
                   ) -> tuple[RunResult, ScriptedLLM]:
    options = options or PlanningOptions()
    server = ScriptedLLM(script, tokens_per_second=tps)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, budget=budget, options=options)
        return await loop.run("compare the weather in Paris and Rome"), server


PLAN = [
    {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
    {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
    {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
]
ANSWER = Text(json.dumps({"answer": "Rome is warmer"}))


@on_virtual_clock
async def test_first_tool_call_starts_before_the_plan_stream_ends() -> None:
    calls: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        return Text(plan_lines(PLAN)) if purpose(req) == "plan" else ANSWER

    result, _ = await run_goal(script, tools_with(calls), tps=60)
    assert result.ok, result.error
    summary = result.summary
    plan_call = next(c for c in result.state.model_calls if c["purpose"] == "plan")
    assert summary["steps"]["paris"]["started_at"] < plan_call["finished_at"] - 0.3
    assert summary["answer"] == "Rome is warmer"
    assert summary["tokens"] > 0
    versions = summary["plan_versions"]
    assert versions[-1]["added"] == ["paris", "rome", "pick"] and versions[-1]["model_finished_at"] is not None


@on_virtual_clock
async def test_malformed_lines_are_repaired_without_losing_work() -> None:
    calls: list[str] = []
    bad = "this is prose\n" + plan_lines([PLAN[0], {"id": "rome", "tool": "fecth", "args": {"city": "Rome"}}])

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(bad)
        if p == "fix":
            return Text(plan_lines(PLAN[1:]))
        return ANSWER

    result, server = await run_goal(script, tools_with(calls))
    assert result.ok, result.error
    assert calls.count("Paris") == 1  # the accepted line ran once, before and after the repair
    fix = next(r for r in server.chat_requests if purpose(r) == "fix")
    text = fix.messages[-1]["content"]
    assert "unknown tool 'fecth' (did you mean 'fetch'?)" in text and text.count("\n- ") == 1
    assert "prose" not in text  # a line that is plainly not a step is skipped, not fed back
    assert [e["rung"] for e in result.state.escalations] == ["repair_lines"]


@on_virtual_clock
async def test_failure_is_repaired_locally_while_other_steps_keep_running() -> None:
    calls: list[str] = []
    plan = [
        {"id": "paris", "tool": "fetch", "args": {"city": "Paris", "fail": True}},
        {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
        {"id": "slow", "tool": "sleep", "args": {"seconds": 0.5}},
        {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
    ]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(plan))
        if p == "repair":
            return Text(plan_lines([
                {"id": "paris", "tool": "fetch", "args": {"city": "Paris-Orly"}},
                {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
            ]), ttft=0.1)
        return ANSWER

    result, _ = await run_goal(script, tools_with(calls))
    assert result.ok, result.error
    state = result.state
    assert [e["rung"] for e in state.escalations] == ["local_repair"]
    assert calls.count("Rome") == 1  # the finished branch was kept, not re-run
    repair = next(v for v in state.versions if v["trigger"] == "local_repair")
    assert set(repair["added"]) == {"paris", "pick"} and "rome" in repair["kept"]
    assert "slow" in repair["adopted"]  # still running while the model re-planned: adopted, not restarted
    assert result.outputs["pick"] == {"p": 30, "r": 12}


@on_virtual_clock
async def test_escalation_climbs_to_global_replan_then_fails_with_a_report() -> None:
    calls: list[str] = []
    broken = [{"id": "paris", "tool": "fetch", "args": {"city": "Paris", "fail": True}},
              {"id": "pick", "tool": "noop", "args": {"p": "${paris}"}}]

    def script(req: RecordedRequest) -> Reply:
        return Text(plan_lines(broken)) if purpose(req) != "join" else ANSWER

    result, _ = await run_goal(script, tools_with(calls), options=PlanningOptions(max_replans=2))
    assert result.status == "failed"
    rungs = [e["rung"] for e in result.state.escalations]
    assert rungs[:2] == ["local_repair", "global_replan"]
    assert rungs[-1] == "fail"
    assert "re-plan limit (2)" in result.state.escalations[-1]["reason"]
    assert result.error is not None and "paris" in result.error


@on_virtual_clock
async def test_joiner_can_ask_for_a_replan_and_the_limit_holds() -> None:
    calls: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(PLAN[:1]))
        if p == "join":
            return Text(json.dumps({"replan": "Rome is missing"}))
        return Text(plan_lines([{"id": f"rome{len(calls)}", "tool": "fetch", "args": {"city": f"Rome{len(calls)}"}}]))

    result, _ = await run_goal(script, tools_with(calls), options=PlanningOptions(max_replans=2))
    assert result.status == "succeeded"  # every step succeeded; there is just no answer
    assert result.summary["answer"] is None
    assert [v["trigger"] for v in result.summary["plan_versions"]] == ["initial", "joiner", "joiner"]
    assert result.state.escalations[-1]["rung"] == "fail"


@on_virtual_clock
async def test_token_budget_stops_the_run_cleanly_and_says_why() -> None:
    calls: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        return Text(plan_lines(PLAN)) if purpose(req) == "plan" else ANSWER

    # The joiner may not be lowered below its 2,500 tokens: with nothing in flight, its worst case is refused.
    result, server = await run_goal(script, tools_with(calls), budget=Budget(tokens=3000),
                                    options=PlanningOptions(plan_max_tokens=1500, join_max_tokens=2500,
                                                            join_min_tokens=2500))
    assert result.status == "failed"  # stopped by its budget: a failure, not a cancellation
    assert result.error is not None and "stopped by its budget: budget exceeded" in result.error
    assert len(server.chat_requests) == 1  # the joiner call was never sent: its reservation did not fit


@on_virtual_clock
async def test_deadline_stops_the_run_cleanly() -> None:
    calls: list[str] = []
    plan = [{"id": "long", "tool": "sleep", "args": {"seconds": 30}}]

    def script(req: RecordedRequest) -> Reply:
        return Text(plan_lines(plan)) if purpose(req) == "plan" else ANSWER

    result, _ = await run_goal(script, tools_with(calls), options=PlanningOptions(deadline_s=0.5))
    assert result.status == "cancelled"
    assert result.error is not None and "deadline of 0.5s" in result.error
    assert result.summary["makespan_s"] < 5


@pytest.mark.parametrize("kind", ["observation", "verifier"])
@on_virtual_clock
async def test_observations_and_verifiers_trigger_replans(kind: str) -> None:
    calls: list[str] = []
    first = [{"id": "look", "tool": "fetch", "args": {"city": "Paris"}, "observe": True}] if kind == "observation" \
        else [{"id": "look", "tool": "fetch", "args": {"city": "Paris"}},
              {"id": "check", "tool": "noop", "args": {"ok": False, "reason": "too cold"}, "verifies": "look"}]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(first))
        if p in ("replan", "repair"):
            return Text(plan_lines([{"id": "rome", "tool": "fetch", "args": {"city": "Rome"}}]))
        return ANSWER

    result, _ = await run_goal(script, tools_with(calls))
    assert result.ok, result.error
    assert "Rome" in calls
    assert result.summary["plan_versions"][-1]["trigger"] in ("observation", "local_repair")


@on_virtual_clock
async def test_llm_steps_count_their_tokens_in_the_run() -> None:
    from planweave.tools.llm import llm_tool

    def script(req: RecordedRequest) -> Reply:
        last = str(req.messages[-1]["content"])
        if "If the results answer the goal" in last:
            return ANSWER
        if last.startswith("Summarise"):
            return Text("Paris 30, Rome 12", prompt_tokens=40, completion_tokens=7)
        return Text(plan_lines([PLAN[0], {"id": "sum", "tool": "llm", "args": {"prompt": "Summarise ${paris}"}}]))

    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", clock=VirtualClock()) as engine:
        tools = tools_with([]).merged(Toolbox({"llm": llm_tool(client)}))
        result = await PlanningLoop(engine, client, tools).run("weather")
    assert result.ok, result.error
    assert result.state.plan.steps["sum"].resources == {"model:scripted": 1}  # queued by the engine, not the client
    step_calls = [c for c in result.state.model_calls if c["purpose"] == "llm_step"]
    assert len(step_calls) == 1 and step_calls[0]["step"] == "sum"
    assert step_calls[0]["prompt_tokens"] == 40 and step_calls[0]["completion_tokens"] == 7
    assert result.summary["tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"]
                                           for c in result.state.model_calls)


@on_virtual_clock
async def test_failures_are_repaired_while_the_planner_is_still_writing() -> None:
    calls: list[str] = []
    lines = [{"id": "paris", "tool": "fetch", "args": {"city": "Paris", "fail": True}}] + [
        {"id": f"more{i}", "tool": "fetch", "args": {"city": f"City{i}"}} for i in range(6)
    ]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(lines), tokens_per_second=40)  # about 2.5 s of writing
        if p == "repair":
            return Text(plan_lines([{"id": "paris", "tool": "fetch", "args": {"city": "Paris-Orly"}}]))
        return ANSWER

    result, _ = await run_goal(script, tools_with(calls))
    assert result.ok, result.error
    initial, repair = result.state.versions[0], result.state.versions[1]
    assert repair["trigger"] == "local_repair"
    assert repair["spliced_at"] < initial["model_finished_at"]  # the repair landed before the plan was finished
    assert set(initial["added"]) == {"paris", *(f"more{i}" for i in range(6))}
    assert calls.count("Paris-Orly") == 1 and calls.count("City5") == 1
