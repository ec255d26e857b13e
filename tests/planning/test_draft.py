"""Speculative planning: a fast draft model's plan lines, verified by the main planner's, start steps early.

One scripted OpenAI-compatible server on loopback serves two models: ``main`` (slow: 1 s to the first token, 30
tokens/s) and ``draft`` (0.1 s, 300 tokens/s), whose plan agrees with the main planner's for its first ``k`` lines
and then diverges. Everything runs on the virtual clock, so "the first call starts before the main planner wrote its
first line" holds exactly however busy the machine is. Tools record their calls; assertions come after the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planweave import Engine, Toolbox, VirtualClock, builtin_tools, run_virtual
from planweave.bench.draft_planning import workload
from planweave.engine.runtime import RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models import Budget
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.planning.draft import agreeing_prefix
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.timing import on_virtual_clock

GOAL = "compare the weather in Paris and Rome"
PLAN = [
    {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
    {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
    {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
]
ANSWER = Text(json.dumps({"answer": "Rome is warmer"}))


def diverged(plan: Sequence[Mapping[str, Any]], k: int) -> list[dict[str, Any]]:
    """``plan`` with every step from position ``k`` on changed (another city, another argument)."""
    out = []
    for i, step in enumerate(plan):
        s = json.loads(json.dumps(step))
        if i >= k:
            s["args"] = {**s["args"], "city": f"Nowhere{i}"} if s["tool"] == "fetch" else {**s["args"], "x": i}
        out.append(s)
    return out


def script(main: Sequence[Mapping[str, Any]], draft: Sequence[Mapping[str, Any]]) -> Any:
    def reply(req: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in req.messages)
        if req.body.get("model") == "draft":
            return Text(plan_lines(draft), ttft=0.1, tokens_per_second=300)
        if "If the results answer the goal" in text:
            return ANSWER
        return Text(plan_lines(main), ttft=1.0, tokens_per_second=30)

    return reply


class Calls:
    def __init__(self) -> None:
        self.fetched: list[tuple[str, float]] = []
        self.written: list[tuple[str, float]] = []

    def tools(self, clock: VirtualClock, seconds: float = 0.5) -> Toolbox:
        box = builtin_tools()

        async def fetch(city: str) -> dict[str, Any]:
            """Fetch the weather of a city."""
            self.fetched.append((city, clock.now()))
            await asyncio.sleep(seconds)
            return {"city": city, "temp": len(city) * 3}

        async def write(text: str) -> dict[str, Any]:
            """Write a note (an effect: not idempotent)."""
            self.written.append((text, clock.now()))
            return {"ok": True}

        async def work(task: str, seconds: float, inputs: list[Any] | None = None, x: int = 0) -> dict[str, Any]:
            """A step of a seeded workload: its value is a function of its arguments."""
            self.fetched.append((task, clock.now()))
            await asyncio.sleep(seconds)
            return {"value": f"{task}<{','.join(map(str, inputs or []))}>{x}"}

        box.add(fetch, idempotent=True)
        box.add(write)
        box.add(work, idempotent=True)
        return box


async def run_goal(main: Sequence[Mapping[str, Any]], draft: Sequence[Mapping[str, Any]] | None, calls: Calls,
                   *, journal: MemoryJournal | None = None, seconds: float = 0.5,
                   concurrency: int | None = None, budget: Budget | None = None) -> tuple[RunResult, ScriptedLLM]:
    clock = VirtualClock()
    tools = calls.tools(clock, seconds)
    server = ScriptedLLM(script(main, draft or []), models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter, \
            Engine(journal or MemoryJournal(), tools=tools, clock=clock, concurrency=concurrency) as engine:
        options = PlanningOptions(draft=drafter if draft is not None else None)
        loop = PlanningLoop(engine, client, tools, options=options, budget=budget)
        result = await asyncio.wait_for(loop.run(GOAL), 60)
    return result, server


def began(result: RunResult) -> float:
    """When the run's planner was asked (runs of one test share the virtual clock: times are relative to it)."""
    return float(next(c["started_at"] for c in result.state.model_calls if c["purpose"] == "plan"))


def first_call(result: RunResult) -> float:
    return min(r.started_at for r in result.state.records.values() if r.started_at is not None) - began(result)


@on_virtual_clock
async def test_an_agreeing_draft_starts_the_steps_early_and_they_are_adopted_not_rerun() -> None:
    plain_calls, calls = Calls(), Calls()
    plain, _ = await run_goal(PLAN, None, plain_calls)
    result, server = await run_goal(PLAN, PLAN, calls)
    assert plain.ok and result.ok, (plain.error, result.error)
    assert sorted(c for c, _ in calls.fetched) == ["Paris", "Rome"]  # each tool call made once: adopted
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer
    assert [(s["step"], s["outcome"]) for s in result.state.speculations] == [
        ("paris", "adopted"), ("rome", "adopted"), ("pick", "adopted")]
    # The draft's first line is written by 0.1 s + a few tokens at 300/s; the main planner's takes more than 1 s.
    assert first_call(result) < 0.5 < 1.0 < first_call(plain)
    assert min(t for _, t in calls.fetched) - began(result) < 0.5
    assert [c["purpose"] for c in result.state.model_calls] == ["draft", "plan", "join"]
    assert {r.body.get("model") for r in server.chat_requests} == {"main", "draft"}


@on_virtual_clock
async def test_a_diverging_draft_step_runs_but_its_output_never_reaches_the_journal() -> None:
    journal, calls = MemoryJournal(), Calls()
    plain, _ = await run_goal(PLAN, None, Calls())
    result, _ = await run_goal(PLAN, diverged(PLAN, 1), calls, journal=journal)
    assert result.ok, result.error
    assert any(c == "Nowhere1" for c, _ in calls.fetched)  # the discarded draft step did call its tool
    outcomes = {s["step"]: s["outcome"] for s in result.state.speculations}
    assert outcomes["paris"] == "adopted"
    assert outcomes["rome"].startswith("discarded: draft: the main planner disagrees at line 2")
    assert [c for c, _ in calls.fetched].count("Paris") == 1 and [c for c, _ in calls.fetched].count("Rome") == 1
    assert result.outputs == plain.outputs
    events = await journal.read(result.run_id)
    text = json.dumps([e.data for e in events if e.kind != "run_created"], default=str)
    blobs = json.dumps(result.outputs)
    assert "Nowhere1" not in blobs
    assert "Nowhere1" not in text  # no event (output, args, summary) carries the discarded attempt's call


@on_virtual_clock
async def test_unsafe_draft_steps_never_start_before_the_main_planner_writes_them() -> None:
    plan: list[dict[str, Any]] = [{"id": "note", "tool": "write", "args": {"text": "hello"}},
            {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
            {"id": "careful", "tool": "fetch", "args": {"city": "Rome"}, "idempotent": False}]
    calls = Calls()
    result, _ = await run_goal(plan, plan, calls)
    assert result.ok, result.error
    started = {s["step"] for s in result.state.speculations}
    assert started == {"paris"}  # the write and the non-idempotent fetch waited for the main planner
    planned = {sid: rec.started_at for sid, rec in result.state.records.items()}
    assert calls.written == [("hello", planned["note"])] and planned["note"] is not None
    assert planned["note"] - began(result) > 1.0  # after the main planner's first line (1 s to its first token)
    rome = [t - began(result) for c, t in calls.fetched if c == "Rome"]
    assert len(rome) == 1 and rome[0] > 1.0


def test_plan_and_answer_are_the_main_planners_at_every_agreement_point() -> None:
    baseline = run_virtual(run_goal(PLAN, None, Calls()))[0]

    @settings(max_examples=8, deadline=None, database=None)
    @given(k=st.integers(min_value=0, max_value=len(PLAN)), tool_s=st.sampled_from([0.05, 0.5, 3.0]))
    def check(k: int, tool_s: float) -> None:
        plain = run_virtual(run_goal(PLAN, None, Calls(), seconds=tool_s))[0]
        calls = Calls()
        result = run_virtual(run_goal(PLAN, diverged(PLAN, k), calls, seconds=tool_s))[0]
        assert result.ok, result.error
        assert result.outputs == plain.outputs == baseline.outputs
        assert result.state.answer == plain.state.answer
        assert result.state.plan.to_document()["steps"] == plain.state.plan.to_document()["steps"]
        adopted = [s["step"] for s in result.state.speculations if s["outcome"] == "adopted"]
        agreed = [s["id"] for s in PLAN[:k]]
        assert set(adopted) <= set(agreed)
        # The fetches need no input: drafted, they are adopted. 'pick' may start as a plain step at the moment its
        # inputs exist, which is when its draft attempt could have started: nothing to gain there.
        assert {"paris", "rome"} & set(agreed) <= set(adopted)
        assert sorted(c for c, _ in calls.fetched if not c.startswith("Nowhere")) == ["Paris", "Rome"]

    check()


def test_agreeing_prefix_compares_fingerprints_not_ids() -> None:
    renamed = [{"id": "p", "tool": "fetch", "args": {"city": "Paris"}},
               {"id": "r", "tool": "fetch", "args": {"city": "Rome"}},
               {"id": "x", "tool": "noop", "args": {"p": "${p.temp}", "r": "${r.temp}"}}]
    assert agreeing_prefix(PLAN, renamed) == 3
    swapped = [renamed[0], renamed[1], {**renamed[2], "args": {"p": "${r.temp}", "r": "${p.temp}"}}]
    assert agreeing_prefix(PLAN, swapped) == 2
    assert agreeing_prefix(PLAN, [{**PLAN[0], "timeout": 5}]) == 0  # another field: another step
    assert agreeing_prefix(PLAN, [{"id": "q", "tool": "noop", "args": {"v": "${nowhere.x}"}}]) == 0


@on_virtual_clock
async def test_a_run_stopped_mid_draft_resumes_to_the_plain_runs_outputs() -> None:
    plain, _ = await run_goal(PLAN, None, Calls(), seconds=3.0)
    journal, calls = MemoryJournal(), Calls()
    clock = VirtualClock()
    tools = calls.tools(clock, 3.0)
    server = ScriptedLLM(script(PLAN, PLAN), models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter:
        options = PlanningOptions(draft=drafter)
        async with Engine(journal, tools=tools, clock=clock) as engine:
            run = await PlanningLoop(engine, client, tools, options=options).start(GOAL)
            planned = asyncio.Event()
            run.subscribe(lambda e: planned.set() if e.kind == "steps_added" and e.data.get("model_finished_at")
                          else None)
            await asyncio.wait_for(planned.wait(), 30)  # the plan is written; the draft's fetches still run
            in_flight = [s["step"] for s in run.state.speculations if s["outcome"] == "running"]
        # the engine closed under it: the run is left as a crash leaves it
        async with Engine(journal, tools=tools, clock=clock) as engine:
            resumed = await PlanningLoop(engine, client, tools, options=PlanningOptions()).resume(run.id)
            result = await asyncio.wait_for(resumed.wait(), 30)
    assert in_flight == ["paris", "rome"]
    assert result.ok, result.error
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer
    assert {s["step"]: s["outcome"] for s in result.state.speculations} == {
        "paris": "interrupted", "rome": "interrupted"}


@on_virtual_clock
async def test_draft_attempts_run_on_spare_slots_and_a_real_step_never_waits_for_one() -> None:
    plan: list[dict[str, Any]] = [{"id": "note", "tool": "write", "args": {"text": "hello"}},
                                  {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
                                  {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}}]
    calls = Calls()
    result, _ = await run_goal(plan, plan, calls, seconds=3.0, concurrency=1)
    assert result.ok, result.error
    outcomes = {s["step"]: s["outcome"] for s in result.state.speculations}
    # One slot: the draft's 'paris' took it (its 'rome' found none) until the planner's 'note' needed it; then the
    # draft's 'rome' took it until the planner's 'paris' did.
    assert outcomes == {"paris": "discarded: draft: preempted by a real step",
                        "rome": "discarded: draft: preempted by a real step"}
    note = result.state.records["note"]
    line_at = next(t for text, t in calls.written if text == "hello")
    assert note.started_at == line_at  # admitted the moment its line was, not after the draft's 3 s fetch
    assert [c for c, _ in calls.fetched] == ["Paris", "Rome", "Paris", "Rome"]  # thrown away, then the real ones


@on_virtual_clock
async def test_a_verified_draft_attempt_keeps_running_when_its_own_step_takes_the_slot() -> None:
    calls = Calls()
    result, _ = await run_goal(PLAN[:1], PLAN[:1], calls, seconds=3.0, concurrency=1)
    assert result.ok, result.error
    assert [(s["step"], s["outcome"]) for s in result.state.speculations] == [("paris", "adopted")]
    assert [c for c, _ in calls.fetched] == ["Paris"]


@on_virtual_clock
async def test_the_draft_call_is_charged_to_the_budget_and_never_squeezes_the_planner() -> None:
    ample = Budget(tokens=100_000)
    result, server = await run_goal(PLAN, PLAN, Calls(), budget=ample)
    assert result.ok, result.error
    assert ample.spent_tokens == result.state.tokens  # the draft's call too, as journaled
    assert "draft" in [c["purpose"] for c in result.state.model_calls]
    # Room for the planner's worst case (~1,300 prompt tokens + 2,048) but not for the draft's beside it: no draft.
    tight = Budget(tokens=5_000)
    plain, _ = await run_goal(PLAN, None, Calls(), budget=Budget(tokens=5_000))
    result, server = await run_goal(PLAN, PLAN, Calls(), budget=tight)
    assert result.ok, result.error
    assert [r.body.get("model") for r in server.chat_requests] == ["main", "main"]  # planner and joiner only
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer
    assert not result.state.speculations


def test_random_plans_give_the_planners_results_whatever_the_draft_and_the_slots() -> None:
    @settings(max_examples=10, deadline=None, database=None)
    @given(seed=st.integers(0, 10_000), steps=st.integers(2, 6), data=st.data(),
           concurrency=st.sampled_from([None, 1, 2]), scale=st.sampled_from([0.1, 1.0, 4.0]))
    def check(seed: int, steps: int, data: st.DataObject, concurrency: int | None, scale: float) -> None:
        plan = workload(seed, steps, scale)
        k = data.draw(st.integers(0, steps), label="agreeing prefix")
        plain = run_virtual(run_goal(plan, None, Calls(), concurrency=concurrency))[0]
        result = run_virtual(run_goal(plan, diverged(plan, k), Calls(), concurrency=concurrency))[0]
        assert plain.ok and result.ok, (plain.error, result.error)
        assert result.outputs == plain.outputs
        assert result.state.answer == plain.state.answer
        assert result.state.plan.to_document()["steps"] == plain.state.plan.to_document()["steps"]
        adopted = {s["step"] for s in result.state.speculations if s["outcome"] == "adopted"}
        assert adopted <= {s["id"] for s in plan[:k]}

    check()
