"""The planner escalates too: a goal run's planning loop with a PlannerCascade calls the small model first, moves
up a tier when its monitors fire (plans rejected again and again: stuck; a verifier refusing the plan's work:
milestone), and comes back down after a streak of accepted plans; against the scripted server, on virtual time."""

from __future__ import annotations

import json
from typing import Any

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.allocate import TierProfile, TierTable
from planweave.allocate.cascade_seam import PlannerCascade
from planweave.core.events import Event
from planweave.engine.runtime import RunResult
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_loop import purpose
from tests.timing import on_virtual_clock

TIERS = TierTable({
    "small": TierProfile("small", "m-small", p_success=0.6, duration_s=1.0, cost_usd=0.0001),
    "medium": TierProfile("medium", "m-medium", p_success=0.8, duration_s=2.0, cost_usd=0.001),
    "large": TierProfile("large", "m-large", p_success=0.99, duration_s=4.0, cost_usd=0.01),
})
ANSWER = Text(json.dumps({"answer": "done"}))
GOOD = [{"id": "a", "tool": "noop", "args": {"x": 1}}]


async def run_goal(script: Any, cascade: PlannerCascade) -> tuple[RunResult, list[tuple[str, str]], list[Event]]:
    """Run a goal; the result, (purpose, model) of every model call, and the run's events."""
    tools: Toolbox = builtin_tools()
    async with ScriptedLLM(script) as base_url, OpenAIChatClient("m-small", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, cascade=cascade)
        run = await loop.start("do it")
        result = await run.wait()
        events = list(await engine.journal.read(run.id))
    calls = [(e.data["purpose"], e.data["model"]) for e in events if e.kind == "model_call"]
    return result, calls, events


def moves(events: list[Event]) -> list[tuple[str, str | None, str, str]]:
    return [(e.data["rung"], e.data.get("monitor"), e.data["from_tier"], e.data["to_tier"]) for e in events
            if e.kind == "escalation" and e.data.get("cascade") == "planner"]


@on_virtual_clock
async def test_plans_rejected_twice_move_the_planner_to_the_next_tier() -> None:
    def script(req: RecordedRequest) -> Reply:
        if purpose(req) == "join":
            return ANSWER
        if req.body["model"] == "m-small":  # the small model keeps naming a tool that does not exist
            return Text(plan_lines([{"id": "a", "tool": "no_such_tool", "args": {}}]))
        return Text(plan_lines(GOOD))

    result, calls, events = await run_goal(script, PlannerCascade(TIERS))
    assert result.ok, result.error
    assert calls == [("plan", "m-small"), ("plan", "m-small"), ("plan", "m-medium"), ("join", "m-medium")]
    assert moves(events) == [("escalate", "stuck", "small", "medium")]
    up = next(e for e in events if e.kind == "escalation" and e.data.get("cascade") == "planner")
    assert up.step is None and "2 failures in a row" in up.data["reason"] and up.data["model"] == "m-medium"


@on_virtual_clock
async def test_a_verifier_rejection_escalates_the_replan_and_an_accepted_plan_brings_it_back_down() -> None:
    first = [{"id": "look", "tool": "noop", "args": {"x": 1}},
             {"id": "check", "tool": "noop", "args": {"ok": False, "reason": "wrong"}, "verifies": "look"}]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(first))
        if p in ("replan", "repair"):
            return Text(plan_lines([{"id": "again", "tool": "noop", "args": {"x": 2}}]))
        return ANSWER

    result, calls, events = await run_goal(script, PlannerCascade(TIERS, streak=1))
    assert result.ok, result.error
    # the plan was accepted (a streak of 1 at small: nothing lower); the verifier's rejection escalates, so the
    # repair runs on medium; its accepted proposal is a streak of 1 on medium, so the joiner runs on small again
    assert [m for _, m in calls] == ["m-small", "m-medium", "m-small"]
    assert [p for p, _ in calls][-1] == "join"
    assert moves(events) == [("escalate", "milestone", "small", "medium"), ("deescalate", None, "medium", "small")]


@on_virtual_clock
async def test_without_a_cascade_the_planner_calls_the_clients_model() -> None:
    seen: list[str | None] = []

    def script(req: RecordedRequest) -> Reply:
        seen.append(req.body.get("model"))
        return ANSWER if purpose(req) == "join" else Text(plan_lines(GOOD))

    tools: Toolbox = builtin_tools()
    async with ScriptedLLM(script) as base_url, OpenAIChatClient("m-client", base_url=base_url, api_key="k") as c, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        result = await PlanningLoop(engine, c, tools).run("do it")
    assert result.ok and seen == ["m-client", "m-client"]
