"""Speculative planning of re-plans: the draft model drafts a re-plan's lines as it drafts the initial plan's, the
main planner's lines verify them, and the run is the main planner's alone.

The joiner asks for a re-plan once; the re-plan refers to a finished step of the first plan (``${paris.temp}``).
The draft names its steps otherwise (``r``, ``x``): steps are compared by fingerprint. Virtual clock: the draft
(0.1 s to its first token) always writes before the main planner (1 s); tools record their calls, asserted after.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from planweave import Engine, VirtualClock
from planweave.engine.runtime import RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.planning.draft import agreeing_prefix
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_draft import GOAL, Calls
from tests.timing import on_virtual_clock

FIRST = [{"id": "paris", "tool": "fetch", "args": {"city": "Paris"}}]
REPLAN = [{"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
          {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}}]
RENAMED = [{"id": "r", "tool": "fetch", "args": {"city": "Rome"}},
           {"id": "x", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${r.temp}"}}]
WRONG = [{"id": "r", "tool": "fetch", "args": {"city": "Nowhere"}},
         {"id": "x", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${r.temp}"}}]


def script(draft_replan: Sequence[Mapping[str, Any]]) -> Any:
    joins: list[int] = []

    def reply(req: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in req.messages)
        replan = "Write the REMAINING plan only" in text
        if req.body.get("model") == "draft":
            return Text(plan_lines(draft_replan if replan else FIRST), ttft=0.1, tokens_per_second=300)
        if "If the results answer the goal" in text:
            joins.append(1)
            if len(joins) == 1:
                return Text(json.dumps({"replan": "Rome is missing"}))
            return Text(json.dumps({"answer": "Rome is warmer"}))
        return Text(plan_lines(REPLAN if replan else FIRST), ttft=1.0, tokens_per_second=30)

    return reply


async def run_goal(draft_replan: Sequence[Mapping[str, Any]] | None, calls: Calls) -> RunResult:
    clock = VirtualClock()
    tools = calls.tools(clock)
    server = ScriptedLLM(script(draft_replan or []), models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter, \
            Engine(MemoryJournal(), tools=tools, clock=clock) as engine:
        options = PlanningOptions(draft=drafter if draft_replan is not None else None)
        loop = PlanningLoop(engine, client, tools, options=options)
        return await asyncio.wait_for(loop.run(GOAL), 60)


def replan_started(result: RunResult) -> float:
    return float(next(c["started_at"] for c in result.state.model_calls if c["purpose"] == "replan"))


@on_virtual_clock
async def test_an_agreeing_draft_of_a_replan_starts_its_steps_early_and_they_are_adopted() -> None:
    plain_calls, calls = Calls(), Calls()
    plain = await run_goal(None, plain_calls)
    result = await run_goal(RENAMED, calls)
    assert plain.ok and result.ok, (plain.error, result.error)
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer == "Rome is warmer"
    assert sorted(c for c, _ in calls.fetched) == ["Paris", "Rome"]  # each call once: adopted, not rerun
    assert [(s["step"], s["outcome"]) for s in result.state.speculations] == [
        ("paris", "adopted"), ("r", "adopted"), ("x", "adopted")]
    # Rome is fetched before the main planner's first re-plan token (1 s after it is asked); without a draft after.
    rome = next(t for c, t in calls.fetched if c == "Rome") - replan_started(result)
    plain_rome = next(t for c, t in plain_calls.fetched if c == "Rome") - replan_started(plain)
    assert rome < 0.5 < 1.0 < plain_rome
    assert [c["purpose"] for c in result.state.model_calls].count("draft") == 2
    assert set(result.state.plan.steps) == {"paris", "rome", "pick"}  # the main planner's plan, its ids
    # The summary (run --json): the two draft calls are speculation's extra calls; paris's and Rome's attempts
    # (0.5 s each) ended before their steps' real start, all of their time ahead; pick's (a no-op) none.
    spec = result.state.speculation_summary()
    assert (spec["started"], spec["adopted"], spec["discarded"], spec["extra_model_calls"]) == (3, 3, 0, 2)
    assert spec["head_start_s"] == pytest.approx(1.0)


@on_virtual_clock
async def test_a_diverging_draft_of_a_replan_is_thrown_away_and_the_run_is_the_planners() -> None:
    plain_calls, calls = Calls(), Calls()
    plain = await run_goal(None, plain_calls)
    result = await run_goal(WRONG, calls)
    assert plain.ok and result.ok, (plain.error, result.error)
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer
    assert sorted(c for c, _ in calls.fetched) == ["Nowhere", "Paris", "Rome"]  # the draft's ran, thrown away
    outcomes = [(s["step"], s["outcome"].split(":")[0]) for s in result.state.speculations]
    assert outcomes == [("paris", "adopted"), ("r", "discarded"), ("x", "discarded")]  # x ran on r's output
    assert "Nowhere" not in json.dumps(result.outputs)


def test_a_replans_lines_are_compared_with_the_runs_finished_steps_as_context() -> None:
    assert agreeing_prefix(REPLAN, RENAMED) == 1  # without the context, pick's ${paris.temp} refers to nothing
    assert agreeing_prefix(REPLAN, RENAMED, FIRST) == 2
    assert agreeing_prefix(REPLAN, WRONG, FIRST) == 0
