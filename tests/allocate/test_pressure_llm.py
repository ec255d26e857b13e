"""Deadline pressure against the scripted model server, on the virtual clock: ``model: auto`` steps switch to the
faster tier once the forecast falls below the threshold (per-model latency), and a goal run re-plans with the time
left stated in the planner's prompt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.allocate import AllocationSeam, Allocator, TierProfile, TierTable
from planweave.allocate.pressure_watch import PressureWatch
from planweave.core.events import Event
from planweave.core.plan.model import DeadlinePressure
from planweave.engine.runtime import cancel_at_deadline
from planweave.forecast.live import LiveOptions, start_live_forecast
from planweave.limits import RunLimits
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.planning import build_planning_loop
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.testing.scripted_llm import plan_lines

# The tier table is optimistic (strong answers in 1 s, it says), so the allocator keeps choosing the strong tier;
# the server's strong model takes 6 s, its fast one 1 s.
TIERS = TierTable({
    "fast": TierProfile("fast", "m-fast", p_success=0.7, duration_s=0.5, cost_usd=0.0),
    "strong": TierProfile("strong", "m-strong", p_success=0.99, duration_s=1.0, cost_usd=0.0),
})
LATENCY = {"m-strong": 6.0, "m-fast": 1.0}


async def by_latency(request: RecordedRequest) -> Reply:
    await asyncio.sleep(LATENCY.get(request.body["model"], 0.0))
    return Text("ok")


def auto(sid: str, after: list[str]) -> dict[str, Any]:
    return {"id": sid, "tool": "llm", "after": after, "estimate": {"duration": 3},
            "args": {"prompt": f"{sid}?", "model": "auto", "tiers": ["fast", "strong"], "max_tokens": 10}}


# s1 -> s2 -> s3 (3 s each, the plan says) beside 'tick' (5.5 s): 9 s, in time for 11 s at first; when 'tick' ends
# at 5.5, s1 has run longer than its estimate and s2 and s3 still need 6 s: 11.5 s, late.
PLAN = {"steps": [auto("s1", []), auto("s2", ["s1"]), auto("s3", ["s2"]),
                  {"id": "tick", "tool": "sleep", "args": {"seconds": 5.5}, "estimate": {"duration": 5.5}}]}
DEADLINE = 11.0


@asynccontextmanager
async def serving(script: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("m-fast", base_url=base_url, api_key="k",
                                                    backoff=Backoff(attempts=1, base=0.01, cap=0.02)) as client:
        yield server, client


def run_auto(pressure: DeadlinePressure | None) -> tuple[str, list[Event], list[tuple[float, str]]]:
    async def go() -> tuple[str, list[Event], list[tuple[float, str]]]:
        async with serving(by_latency) as (server, client):
            clock = VirtualClock()
            seam = AllocationSeam(TIERS, allocator=Allocator(TIERS, sims=100))
            tools = builtin_tools().merged(Toolbox({"llm": _llm(client, seam)}))
            async with open_engine("memory://", clock=clock, tools=tools) as engine:
                seam.bind(engine.get)
                seam.deadline_at = clock.now() + DEADLINE
                run = await engine.start(PLAN, run_id="auto")
                cancel_at_deadline(engine, run, DEADLINE)
                live = start_live_forecast(engine, run, LiveOptions(deadline=DEADLINE, runs=50, share=None))
                if pressure is not None:
                    PressureWatch(run, pressure, seam=seam)
                result = await run.wait()
                await (await live).wait()
                events = list(await engine.journal.read(run.id))
            served = [(c.started, str(r.body["model"])) for c, r in zip(server.served, server.chat_requests,
                                                                         strict=True)]
        return result.status, events, served

    return run_virtual(go())


def _llm(client: OpenAIChatClient, seam: AllocationSeam) -> Any:
    from planweave.tools.llm import llm_tool

    return llm_tool(client, None, allocation=seam)


def test_under_pressure_the_remaining_auto_steps_get_the_faster_tier_and_the_run_ends_in_time() -> None:
    status, events, served = run_auto(DeadlinePressure.model_validate({"actions": ["faster_tiers"]}))
    assert status == "succeeded"
    (escalation,) = [e for e in events if e.kind == "escalation"]
    assert escalation.at == 5.5
    assert (escalation.data["rung"], escalation.data["action"]) == ("deadline_pressure", "faster_tiers")
    assert escalation.data["steps"] == ["s1", "s2", "s3"] and escalation.data["p_deadline"] < 0.5
    decided = {e.step: e.data for e in events if e.kind == "allocation"}
    assert decided["s1"]["tier"] == "strong"  # before the pressure: the allocator's own choice
    assert decided["s2"]["tier"] == decided["s3"]["tier"] == "fast"
    assert "deadline pressure" in decided["s2"]["reason"]
    assert [m for _, m in served] == ["m-strong", "m-fast", "m-fast"]
    assert events[-1].kind == "run_finished" and events[-1].at == 8.0


def test_without_pressure_the_allocator_keeps_the_strong_tier_and_the_deadline_stops_the_run() -> None:
    status, events, served = run_auto(None)
    assert status == "cancelled"
    assert [m for _, m in served] == ["m-strong", "m-strong"]
    assert not [e for e in events if e.kind == "escalation"]


# -- a goal run re-plans with the time left -------------------------------------------------------------------------
# 'gather' is estimated at 2 s and takes 30; when 'tick' ends at 4, 'write' (7 s) still follows it: 11 s, late for 10.
SLOW = [{"id": "gather", "tool": "sleep", "args": {"seconds": 30}, "estimate": {"duration": 2}},
        {"id": "write", "tool": "sleep", "args": {"seconds": 1}, "after": ["gather"], "estimate": {"duration": 7}},
        {"id": "tick", "tool": "sleep", "args": {"seconds": 4}, "estimate": {"duration": 4}}]
QUICK = [{"id": "gist", "tool": "sleep", "args": {"seconds": 1, "result": "gist"}, "estimate": {"duration": 1}}]


def planner(request: RecordedRequest) -> Reply:
    text = " ".join(str(m.get("content")) for m in request.messages)
    if "Why a new plan is needed" in text:
        return Text(plan_lines(QUICK))
    if "Write the plan" in text:
        return Text(plan_lines(SLOW))
    return Text('{"answer": "the gist"}')


def test_a_goal_run_under_pressure_re_plans_with_the_time_left_in_the_prompt() -> None:
    async def go() -> tuple[Any, list[RecordedRequest], list[Event]]:
        server = ScriptedLLM(planner)
        async with server as base_url, OpenAIChatClient("planner", base_url=base_url, api_key="k") as client, \
                open_engine("memory://", tools=builtin_tools(), clock=VirtualClock()) as engine:
            loop = build_planning_loop(engine, client, builtin_tools(), RunLimits(deadline=10.0))
            run = await loop.start("the gist, in ten seconds")
            live = start_live_forecast(engine, run, LiveOptions(deadline=10.0, runs=50, share=None))
            PressureWatch(run, DeadlinePressure(), planner=loop)
            result = await run.wait()
            await (await live).wait()
            return result, list(server.chat_requests), list(await engine.journal.read(run.id))

    result, requests, events = run_virtual(go())
    assert result.status == "succeeded", result.error
    assert result.summary["answer"] == "the gist"
    (escalation,) = [e for e in events if e.kind == "escalation" and e.data["rung"] == "deadline_pressure"]
    assert escalation.data["action"] == "replan" and escalation.at == 4.0  # 'tick' ended, 'gather' is overdue
    replans = [r for r in requests if "Why a new plan is needed" in " ".join(str(m.get("content"))
                                                                             for m in r.messages)]
    assert len(replans) == 1
    prompt = " ".join(str(m.get("content")) for m in replans[0].messages)
    assert "deadline pressure" in prompt and "6 s remain until the deadline" in prompt
    version = next(e for e in events if e.kind == "plan_version")
    assert version.data["trigger"] == "deadline_pressure" and "gather" in version.data["cancelled"]
    assert result.state.records["gist"].status == "succeeded"
