"""Tool-call planning: the planner's ``add_step`` calls stream into execution one step at a time.

A scripted server on loopback speaks Chat Completions and Anthropic Messages (and the Responses API, in the first
test), streaming each ``add_step`` call's arguments in pieces at 20 tokens/s after 0.5 s to the first token.
Everything runs on the virtual clock, so "the first step started before the planner's stream ended" is an exact
ordering of clock readings, not a race. Tools record when they ran; assertions come after the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from planweave import Engine, Toolbox, VirtualClock, builtin_tools
from planweave.engine.runtime import RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models import ToolCallDelta
from planweave.models.anthropic import AnthropicClient
from planweave.models.openai import OpenAIChatClient
from planweave.models.openai_responses import OpenAIResponsesClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.planning.tool_calls import StepCalls, planner_tools
from planweave.testing.scripted_dialects import Call
from planweave.testing.scripted_llm import HttpError, RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.testing.scripted_planner import offers_add_step, purpose, step_calls
from tests.timing import on_virtual_clock

GOAL = "compare the weather in Paris and Rome"
PLAN = [
    {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
    {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
    {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}, "after": ["paris"]},
]
ANSWER = json.dumps({"answer": "Rome is warmer"})
SLOW = {"ttft": 0.5, "tokens_per_second": 20.0}
CLIENTS: dict[str, type[OpenAIChatClient]] = {"chat": OpenAIChatClient, "anthropic": AnthropicClient,
                                              "responses": OpenAIResponsesClient}


def tools_of(clock: VirtualClock, fetched: list[tuple[str, float]]) -> Toolbox:
    box = builtin_tools()

    async def fetch(city: str) -> dict[str, Any]:
        """Fetch the weather of a city."""
        fetched.append((city, clock.now()))
        await asyncio.sleep(0.1)
        return {"city": city, "temp": len(city) * 3}

    box.add(fetch, idempotent=True)
    return box


Script = Callable[[RecordedRequest], Reply]


def planner(plan_reply: Callable[[RecordedRequest], Reply], fix: Reply | None = None) -> Script:
    def reply(req: RecordedRequest) -> Reply:
        asked = purpose(req)
        if asked == "join":
            return Text(ANSWER)
        if asked == "fix_lines":
            return fix if fix is not None else Text("[]")
        return plan_reply(req)

    return reply


async def run_goal(dialect: str, script: Script, *, plan_via: str = "auto",
                   fetched: list[tuple[str, float]] | None = None) -> tuple[RunResult, ScriptedLLM]:
    clock = VirtualClock()
    seen: list[tuple[str, float]] = [] if fetched is None else fetched
    tools = tools_of(clock, seen)
    server = ScriptedLLM(script)
    async with server as base_url, CLIENTS[dialect]("scripted", base_url=base_url, api_key="k") as client, \
            Engine(MemoryJournal(), tools=tools, clock=clock) as engine:
        options = PlanningOptions(plan_via=plan_via)  # type: ignore[arg-type]
        loop = PlanningLoop(engine, client, tools, options=options)
        result = await asyncio.wait_for(loop.run(GOAL), 60)
    return result, server


def plan_call(result: RunResult) -> dict[str, Any]:
    return next(c for c in result.state.model_calls if c["purpose"] == "plan")


@pytest.mark.parametrize("dialect", ["chat", "anthropic", "responses"])
@on_virtual_clock
async def test_the_first_step_starts_before_the_planner_has_finished_its_tool_calls(dialect: str) -> None:
    fetched: list[tuple[str, float]] = []
    script = planner(lambda req: Text("", tool_calls=step_calls(PLAN), **SLOW)  # type: ignore[arg-type]
                     if offers_add_step(req) else Text("no tools were offered"))
    result, server = await run_goal(dialect, script, fetched=fetched)
    assert result.ok, result.error
    assert result.state.answer == "Rome is warmer"
    call = plan_call(result)
    assert call["plan_via"] == "tools"
    first = min(t for _, t in fetched)
    # 0.5 s to the first token, then three calls of ~15 tokens each at 20 tokens/s: the stream ends after ~2.5 s.
    assert call["started_at"] + 0.5 < first < call["finished_at"] - 1.0
    assert result.state.records["pick"].started_at is not None
    assert sorted(c for c, _ in fetched) == ["Paris", "Rome"]
    first_request = server.model_requests[0]
    assert offers_add_step(first_request) and "add_step" in str(first_request.messages[0].get("content", ""))


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
@on_virtual_clock
async def test_an_invalid_call_is_rejected_with_its_number_and_repaired_by_a_second_call(dialect: str) -> None:
    broken = [PLAN[0], {"id": "rome", "tool": "fetch_weather", "args": {"city": "Rome"}}]
    calls = (*step_calls(broken), Call("call_x", "add_step", '{"id": "half", "tool": '))
    fixed = Text("", tool_calls=step_calls(PLAN[1:], start=5))
    script = planner(lambda req: Text("", tool_calls=calls), fix=fixed)
    result, server = await run_goal(dialect, script)
    assert result.ok, result.error
    repairs = [e for e in result.state.escalations if e.get("rung") == "repair_lines"]
    assert len(repairs) == 1
    assert "add_step call 2: step 'rome', tool: unknown tool 'fetch_weather'" in repairs[0]["reason"]
    assert "add_step call 3: arguments are not valid JSON" in repairs[0]["reason"]
    assert set(result.state.plan.steps) == {"paris", "rome", "pick"}
    fix_request = server.model_requests[1]
    assert purpose(fix_request) == "fix_lines" and offers_add_step(fix_request)
    shown = " ".join(str(m.get("content", "")) for m in fix_request.messages)
    assert 'add_step {"id":"rome","tool":"fetch_weather"' in shown  # its own calls, shown back as text


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
@on_virtual_clock
async def test_a_reply_in_text_is_read_as_json_lines_even_when_tools_were_offered(dialect: str) -> None:
    fetched: list[tuple[str, float]] = []
    result, server = await run_goal(dialect, planner(lambda req: Text(plan_lines(PLAN), **SLOW)),  # type: ignore[arg-type]
                                    fetched=fetched)
    assert result.ok, result.error
    assert offers_add_step(server.model_requests[0])
    assert min(t for _, t in fetched) < plan_call(result)["finished_at"] - 1.0


@on_virtual_clock
async def test_text_mode_offers_no_tools_and_tool_mode_forces_them() -> None:
    result, server = await run_goal("chat", planner(lambda req: Text(plan_lines(PLAN))), plan_via="text")
    assert result.ok, result.error
    assert not offers_add_step(server.model_requests[0])
    assert "JSON Lines" in str(server.model_requests[0].messages[0].get("content", ""))
    assert plan_call(result)["plan_via"] == "text"
    result, server = await run_goal("chat", planner(lambda req: Text("", tool_calls=step_calls(PLAN))),
                                    plan_via="tools")
    assert result.ok, result.error
    assert offers_add_step(server.model_requests[0])


@on_virtual_clock
async def test_an_endpoint_that_refuses_tools_is_planned_with_in_text() -> None:
    def plan(req: RecordedRequest) -> Reply:
        return HttpError(400, "tools are not supported") if offers_add_step(req) else Text(plan_lines(PLAN))

    result, server = await run_goal("chat", planner(plan))
    assert result.ok, result.error
    assert [offers_add_step(r) for r in server.model_requests[:2]] == [True, False]
    assert [e["rung"] for e in result.state.escalations] == ["plan_via_text"]


def test_a_call_is_parsed_the_moment_its_top_level_object_closes() -> None:
    calls = StepCalls()
    text = '{"id": "a", "tool": "t", "args": {"s": "} { \\" ]"}}'
    out = []
    for i, piece in enumerate([text[:10], text[10:30], text[30:]]):
        out.append(calls.feed(ToolCallDelta(0, "c0" if i == 0 else None, "add_step" if i == 0 else None, piece)))
    assert [len(o) for o in out] == [0, 0, 1]
    assert out[2][0].steps == ({"id": "a", "tool": "t", "args": {"s": "} { \" ]"}},)
    assert calls.feed(ToolCallDelta(1, "c1", "other", "{}"))[0].error == \
        "other call 2: unknown function 'other' (call add_step once per step)"
    assert calls.close() == []


def test_the_add_step_schema_names_the_catalog_tools() -> None:
    add = planner_tools(["fetch", "noop"])[0]
    assert add.name == "add_step"
    assert add.parameters["properties"]["tool"]["enum"] == ["fetch", "noop"]
    assert add.parameters["required"] == ["id", "tool"]


def test_the_benchmark_compares_both_modes_on_the_same_goal() -> None:
    from planweave import run_virtual
    from planweave.bench.planning import make_goals
    from planweave.bench.tool_planning import measure

    data = run_virtual(measure(make_goals(1, 3, mean_ms=100), dialect="anthropic", ttft=0.3, tps=30))
    text, tools = data["modes"]["text"], data["modes"]["tools"]
    for mode in (text, tools):
        assert mode["valid_replies"] == mode["replies"] >= 1 and mode["rejected"] == 0
        assert 0.3 < mode["first_call"] < 1.5  # the first step of ~10 starts after one line or call, not the plan
    assert tools["prompt_tokens"] > text["prompt_tokens"]  # add_step's schema rides along with every planner call


@on_virtual_clock
async def test_a_stream_cut_in_the_middle_of_a_call_is_metered_for_its_arguments() -> None:
    from collections.abc import AsyncIterator

    from planweave.models import Completion, Delta
    from planweave.models.budget import StreamMeter
    from planweave.planning.loop import _consume

    async def cut() -> AsyncIterator[Delta | Completion]:
        yield Delta("", tool_call=ToolCallDelta(0, "c0", "add_step", '{"id": "a", "tool": "fetch", '))
        yield Delta("", tool_call=ToolCallDelta(0, None, None, '"args": {"city": "Paris"'))
        raise ConnectionError("cut")

    meter, seen = StreamMeter(100), list[ToolCallDelta]()
    with pytest.raises(ConnectionError):
        await _consume(cut(), lambda _text: None, meter, seen.append)
    assert len(seen) == 2 and meter.received
    assert meter.spent().completion_tokens == 14  # 55 characters of arguments, four a token


@on_virtual_clock
async def test_a_draft_model_is_asked_for_json_lines_while_the_planner_calls_add_step() -> None:
    def reply(req: RecordedRequest) -> Reply:
        if purpose(req) == "join":
            return Text(ANSWER)
        if req.body.get("model") == "draft":
            return Text(plan_lines(PLAN), ttft=0.1, tokens_per_second=300)
        return Text("", tool_calls=step_calls(PLAN), **SLOW)  # type: ignore[arg-type]

    clock = VirtualClock()
    tools = tools_of(clock, [])
    server = ScriptedLLM(reply, models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter, \
            Engine(MemoryJournal(), tools=tools, clock=clock) as engine:
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions(draft=drafter))
        result = await asyncio.wait_for(loop.run(GOAL), 60)
    assert result.ok, result.error
    by_model = {r.body.get("model"): r for r in server.model_requests if purpose(r) == "plan"}
    assert offers_add_step(by_model["main"]) and not offers_add_step(by_model["draft"])
    assert "JSON Lines" in str(by_model["draft"].messages[0].get("content", ""))
    assert "add_step" not in str(by_model["draft"].messages[0].get("content", ""))
    assert {s["outcome"] for s in result.state.speculations} == {"adopted"}
