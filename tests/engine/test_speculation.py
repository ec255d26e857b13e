"""Speculative steps (docs/speculation.md): lossless, on spare capacity only, never for steps unsafe to throw away."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Event, Tool, Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.cli.views import timeline
from planweave.core.context import current_step
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.plan.model import Claim, PlanSpec, SpeculationSpec, Step
from planweave.core.scheduler import Scheduler
from planweave.core.speculation import Prediction, candidates, same_args, unsafe_reason
from planweave.core.state import RunState
from planweave.engine.speculative import resolve_policy
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import virtual

ANY_TIME = SpeculationSpec(mode="safe", max_parallel=1000, min_confidence=0.0)
EAGER_ANY = SpeculationSpec(mode="eager", max_parallel=1000, min_confidence=0.0)


def digest(name: str, inputs: list[Any]) -> str:
    """The deterministic tool's output: a function of its arguments only."""
    return hashlib.sha256(repr((name, inputs)).encode()).hexdigest()[:12]


def true_outputs(doc: Mapping[str, Any]) -> dict[str, str]:
    """Every step's output, computed without the engine (steps are in topological order)."""
    out: dict[str, str] = {}
    for step in doc["steps"]:
        inputs = [out[ref[2:-1]] for ref in step["args"]["inputs"]]
        out[step["id"]] = digest(step["args"]["name"], inputs)
    return out


class Calls:
    """What the tool saw: every call's step, start and end on the engine's clock (recorded, asserted after)."""

    def __init__(self) -> None:
        self.starts: dict[str, list[float]] = {}
        self.ends: dict[str, list[float]] = {}

    def toolbox(self, **tool_options: Any) -> Toolbox:
        box = builtin_tools()
        calls = self

        async def f(name: str, inputs: list[Any], seconds: float = 1.0, fail_first: bool = False) -> str:
            loop = asyncio.get_running_loop()
            calls.starts.setdefault(name, []).append(loop.time())
            await asyncio.sleep(seconds)
            if fail_first and len(calls.starts[name]) == 1:
                raise ConnectionError(f"{name} flaked")
            calls.ends.setdefault(name, []).append(loop.time())
            return digest(name, inputs)

        box.add(f, idempotent=tool_options.get("idempotent", True))
        return box


async def run_doc(doc: Mapping[str, Any], box: Toolbox, speculation: Any, *, concurrency: int | None = None,
                  capacities: Mapping[str, int] | None = None) -> tuple[dict[str, Any], float, list[Event]]:
    journal = MemoryJournal()
    async with open_engine(journal, clock=VirtualClock(), tools=box, concurrency=concurrency,
                           capacities=capacities) as engine:
        run = await engine.start(doc, speculation=speculation)
        result = await run.wait()
        assert result.status == "succeeded", result.error
        events = await journal.read(run.id)
        return dict(result.outputs), float(result.summary["makespan_s"]), events


def kinds(events: list[Event], prefix: str = "speculation_") -> list[tuple[str, str | None]]:
    return [(e.kind, e.step) for e in events if e.kind.startswith(prefix)]


# -- the pure decisions -------------------------------------------------------------------------------------------
def test_unsafe_steps_are_named_with_their_reason() -> None:
    step = Step(id="s", tool="f")
    assert unsafe_reason(step, idempotent=True, tool_speculates=True) is None
    assert unsafe_reason(step, idempotent=False, tool_speculates=True) == "not idempotent"
    assert unsafe_reason(Step(id="s", tool="f", writes=("db",)), idempotent=True, tool_speculates=True) == (
        "claims writes: db")
    assert unsafe_reason(Step(id="s", tool="f", approval=True), idempotent=True, tool_speculates=True) == (
        "waits for an approval")
    assert unsafe_reason(Step(id="s", tool="human.input"), idempotent=True, tool_speculates=True) == (
        "waits for a person")
    assert unsafe_reason(step, idempotent=True, tool_speculates=False) == "tool 'f' says speculate=False"


def _plan(steps: list[dict[str, Any]]) -> Any:
    return validate_plan(parse_plan_document({"steps": steps}, "test"))


def test_candidates_need_a_prediction_of_every_referenced_producer() -> None:
    plan = _plan([
        {"id": "a", "tool": "f"}, {"id": "b", "tool": "f"},
        {"id": "one", "tool": "f", "args": {"x": "${a}"}},
        {"id": "two", "tool": "f", "args": {"x": "${a}", "y": "${b}"}},
        {"id": "ordered", "tool": "f", "args": {"x": "${a}"}, "after": ["b"]},
        {"id": "shape", "tool": "f", "args": {"x": "${a.field}"}},
    ])
    status = {"a": "running", "b": "running"}
    found = candidates(plan, lambda s: status.get(s, "pending"), {},  # type: ignore[arg-type, return-value]
                       {"a": Prediction(3, 0.9, "plan")}, safe=lambda s: True, policy=ANY_TIME)
    # two: b has no prediction; ordered: an after: alone is an order of effects; shape: 3 has no field.
    assert [(c.step, dict(c.args), dict(c.basis)) for c in found] == [("one", {"x": 3}, {"a": "plan"})]
    low = SpeculationSpec(mode="safe", min_confidence=0.95)
    assert candidates(plan, lambda s: status.get(s, "pending"), {},  # type: ignore[arg-type, return-value]
                      {"a": Prediction(3, 0.9, "plan")}, safe=lambda s: True, policy=low) == []


def test_a_writing_producer_or_a_speculative_output_in_safe_mode_is_no_basis() -> None:
    plan = _plan([{"id": "a", "tool": "f", "writes": ["db"]}, {"id": "b", "tool": "f", "args": {"x": "${a}"}},
                  {"id": "c", "tool": "f"}, {"id": "d", "tool": "f", "args": {"x": "${c}"}}])
    status = {"a": "running", "c": "pending"}
    predictions = {"a": Prediction(1, 1.0, "plan"), "c": Prediction(2, 1.0, "speculation")}
    safe = candidates(plan, lambda s: status.get(s, "pending"), {}, predictions,  # type: ignore[arg-type, return-value]
                      safe=lambda s: True, policy=ANY_TIME)
    eager = candidates(plan, lambda s: status.get(s, "pending"), {}, predictions,  # type: ignore[arg-type, return-value]
                       safe=lambda s: True, policy=EAGER_ANY)
    assert [c.step for c in safe] == []
    assert [c.step for c in eager] == ["d"]


def test_same_args_is_canonical_json_equality() -> None:
    assert same_args({"a": [1, {"y": 2, "x": 1}]}, {"a": [1, {"x": 1, "y": 2}]})
    assert not same_args({"a": 1}, {"a": 1.0})  # a doubt discards
    assert not same_args({"a": "1"}, {"a": 1})


def test_the_flag_keeps_the_plans_limits_and_off_wins() -> None:
    spec = PlanSpec(steps=(Step(id="a", tool="f"),), speculation=SpeculationSpec(max_parallel=2))
    assert resolve_policy(spec, "eager") == SpeculationSpec(mode="eager", max_parallel=2)
    assert resolve_policy(spec, "off").mode == "off"
    assert resolve_policy(spec, None) == SpeculationSpec(max_parallel=2)
    assert resolve_policy(PlanSpec(steps=spec.steps), None).mode == "off"


def test_spare_slots_only_when_nothing_waits() -> None:
    scheduler: Scheduler[str] = Scheduler(concurrency=2, capacities={"gpu": 1})
    assert scheduler.try_take_spare(None)
    gpu = Claim({"gpu": 1}, (), ())
    assert scheduler.try_take_spare(gpu)
    assert not scheduler.try_take_spare(None)  # concurrency full
    scheduler.release(None)
    scheduler.push("real", rank=0, ready_at=0, claim=None)
    assert not scheduler.try_take_spare(None)  # a real item waits: it has first claim on the free slot
    assert not scheduler.needs_back(gpu)  # a slot is free for it; the gpu is not what it waits for
    scheduler.push("real-gpu", rank=0, ready_at=0, claim=gpu)
    assert scheduler.needs_back(gpu)


# -- lossless: the property ---------------------------------------------------------------------------------------
@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict[str, Any], int | None, float]:
    n = draw(st.integers(2, 12))
    steps: list[dict[str, Any]] = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        steps.append({"id": f"s{i}", "tool": "f", "args": {
            "name": f"s{i}", "inputs": [f"${{s{p}}}" for p in parents],
            "seconds": draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
            "fail_first": draw(st.booleans()) and draw(st.booleans())},
                      "retries": {"max": 1, "backoff": 0.5, "jitter": 0}})
    accuracy = draw(st.sampled_from([0.0, 0.5, 1.0]))
    truth = true_outputs({"steps": steps})
    for step in steps:
        guess = draw(st.floats(0, 1))
        if draw(st.booleans()) or accuracy == 1.0:
            step["predict"] = truth[step["id"]] if guess < accuracy else "wrong-" + step["id"]
    concurrency = draw(st.one_of(st.none(), st.integers(1, 3)))
    return {"steps": steps, "on_failure": "continue"}, concurrency, accuracy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_outputs_are_identical_with_speculation_off_safe_and_eager(case: tuple[dict[str, Any], int | None, float]
                                                                   ) -> None:
    doc, concurrency, _accuracy = case
    truth = true_outputs(doc)

    async def go() -> dict[str, tuple[dict[str, Any], float, list[Event]]]:
        return {mode: await run_doc(doc, Calls().toolbox(), policy, concurrency=concurrency)
                for mode, policy in (("off", "off"), ("safe", ANY_TIME), ("eager", EAGER_ANY))}

    runs = virtual(go)
    for mode, (outputs, _makespan, events) in runs.items():
        assert outputs == truth, mode
        adopted = {e.step for e in events if e.kind == "speculation_adopted"}
        succeeded = [e.step for e in events if e.kind == "step_succeeded"]
        assert len(succeeded) == len(set(succeeded)) == len(truth), mode  # each step's output journaled once
        assert adopted <= set(succeeded)
    if concurrency is None:  # spare capacity is unlimited: speculation can only bring outputs earlier
        assert runs["safe"][1] <= runs["off"][1] + 1e-9
        assert runs["eager"][1] <= runs["off"][1] + 1e-9


def test_right_predictions_shorten_a_chain_to_its_longest_step() -> None:
    steps: list[dict[str, Any]] = [
        {"id": f"s{i}", "tool": "f", "args": {"name": f"s{i}", "inputs": [f"${{s{i - 1}}}"] if i else [],
                                              "seconds": 2.0}} for i in range(5)]
    truth = true_outputs({"steps": steps})
    doc = {"steps": [{**s, "predict": truth[s["id"]]} for s in steps]}

    async def go() -> tuple[tuple[dict[str, Any], float, list[Event]], tuple[dict[str, Any], float, list[Event]]]:
        return await run_doc(doc, Calls().toolbox(), "off"), await run_doc(doc, Calls().toolbox(), ANY_TIME)

    (off_out, off_span, _), (on_out, on_span, events) = virtual(go)
    assert off_out == on_out == truth
    assert (off_span, on_span) == (10.0, 2.0)
    assert kinds(events).count(("speculation_adopted", "s4")) == 1
    assert not [e for e in events if e.kind == "speculation_discarded"]


def test_a_wrong_prediction_is_discarded_and_the_step_runs_on_real_inputs() -> None:
    calls = Calls()
    doc = {"steps": [
        {"id": "a", "tool": "f", "args": {"name": "a", "inputs": []}, "predict": "not-it"},
        {"id": "b", "tool": "f", "args": {"name": "b", "inputs": ["${a}"]}},
    ]}

    outputs, span, events = virtual(lambda: run_doc(doc, calls.toolbox(), ANY_TIME))
    assert outputs == true_outputs(doc)
    assert span == 2.0
    assert calls.starts["b"] == [0.0, 1.0]  # the speculative call, then the real one
    discarded = [e for e in events if e.kind == "speculation_discarded"]
    assert [(e.step, e.data["reason"]) for e in discarded] == [("b", "mismatch: a")]
    # Nothing of the discarded attempt is a result: b's one step_succeeded comes from the real call.
    assert [e.at for e in events if e.kind == "step_succeeded" and e.step == "b"] == [2.0]


def test_unsafe_steps_never_speculate() -> None:
    doc = {"steps": [
        {"id": "a", "tool": "f", "args": {"name": "a", "inputs": []}, "predict": "x"},
        {"id": "effect", "tool": "f", "idempotent": False, "args": {"name": "e", "inputs": ["${a}"]}},
        {"id": "writer", "tool": "f", "writes": ["db"], "args": {"name": "w", "inputs": ["${a}"]}},
        {"id": "asks", "tool": "f", "approval": True, "args": {"name": "q", "inputs": ["${a}"]}},
        {"id": "fine", "tool": "f", "args": {"name": "fine", "inputs": ["${a}"]}},
    ], "on_failure": "continue"}

    async def go() -> list[Event]:
        journal = MemoryJournal()
        async with open_engine(journal, clock=VirtualClock(), tools=Calls().toolbox()) as engine:
            run = await engine.start(doc, speculation=ANY_TIME)
            await asyncio.sleep(0.5)
            started = [e for e in await journal.read(run.id) if e.kind == "speculation_started"]
            run.cancel()
            return started

    assert [e.step for e in virtual(go)] == ["fine"]


def test_a_tool_that_says_speculate_false_is_never_called_speculatively() -> None:
    calls = Calls()
    box = calls.toolbox()
    box.add(Tool.from_function(box["f"].fn, name="f2", idempotent=True, speculate=False))
    doc = {"steps": [{"id": "a", "tool": "f", "args": {"name": "a", "inputs": []}, "predict": "x"},
                     {"id": "b", "tool": "f2", "args": {"name": "b", "inputs": ["${a}"]}},
                     {"id": "c", "tool": "f", "args": {"name": "c", "inputs": ["${a}"]}}]}
    _outputs, _span, events = virtual(lambda: run_doc(doc, box, ANY_TIME))
    assert ("speculation_started", "b") not in kinds(events)
    assert ("speculation_started", "c") in kinds(events)


# -- capacity: spare slots only, preempted when a real step needs one -----------------------------------------------
def test_a_real_step_never_waits_for_a_speculative_one() -> None:
    """Concurrency 2: ``a`` holds one slot for 4 s; ``c`` fails at 1 s and retries at 2 s. In between, ``b`` takes
    the spare slot speculatively (10 s); the retry of ``c`` needs it at 2 s and gets it at 2 s: ``b`` is preempted."""
    calls = Calls()
    doc = {"steps": [
        {"id": "a", "tool": "f", "args": {"name": "a", "inputs": [], "seconds": 4.0}},
        {"id": "b", "tool": "f", "args": {"name": "b", "inputs": ["${a}"], "seconds": 10.0}},
        {"id": "c", "tool": "f", "args": {"name": "c", "inputs": [], "seconds": 1.0, "fail_first": True},
         "retries": {"max": 1, "backoff": 1.0, "jitter": 0}},
    ]}
    doc["steps"][0]["predict"] = true_outputs(doc)["a"]
    outputs, span, events = virtual(lambda: run_doc(doc, calls.toolbox(), ANY_TIME, concurrency=2))
    assert outputs == true_outputs(doc)
    assert calls.starts["c"] == [0.0, 2.0]  # the retry started the moment it was due
    assert calls.starts["b"][0] == 1.0  # speculative, in the slot c left
    discarded = [(e.step, e.at, e.data["reason"]) for e in events if e.kind == "speculation_discarded"]
    assert discarded[0] == ("b", 2.0, "preempted")
    assert span <= 14.0


def test_speculation_never_takes_a_slot_a_real_step_waits_for() -> None:
    """Concurrency 1 and always a real step queued: nothing speculates at all."""
    doc = {"steps": [
        {"id": "a", "tool": "f", "args": {"name": "a", "inputs": []}},
        {"id": "b", "tool": "f", "args": {"name": "b", "inputs": ["${a}"]}},
        {"id": "x", "tool": "f", "args": {"name": "x", "inputs": []}},
    ]}
    doc["steps"][0]["predict"] = true_outputs(doc)["a"]
    calls = Calls()
    _outputs, span, events = virtual(lambda: run_doc(doc, calls.toolbox(), ANY_TIME, concurrency=1))
    assert kinds(events) == []
    assert span == 3.0


def test_the_extra_cost_of_speculation_stays_within_its_cap() -> None:
    """Every prediction is wrong and every call costs 0.1: with max_extra_cost_usd 0.25, speculation stops once
    what it threw away and what runs would pass the cap; with the default cap 0, steps that cost never speculate."""
    box = builtin_tools()

    async def paid(name: str, inputs: list[Any]) -> str:
        current_step().report_usage({"model": "m", "prompt_tokens": 1, "completion_tokens": 1, "cost_usd": 0.1})
        await asyncio.sleep(1.0)
        return digest(name, inputs)

    box.add(paid, idempotent=True)
    steps: list[dict[str, Any]] = [{"id": "a", "tool": "paid", "args": {"name": "a", "inputs": []},
                                    "predict": "wrong"}]
    steps += [{"id": f"b{i}", "tool": "paid", "args": {"name": f"b{i}", "inputs": ["${a}"]},
               "estimate": {"cost": 0.1}} for i in range(6)]
    doc = {"steps": steps}
    capped = SpeculationSpec(mode="safe", max_parallel=100, min_confidence=0.0, max_extra_cost_usd=0.25)

    async def go(policy: SpeculationSpec) -> tuple[dict[str, Any], list[Event], Any]:
        journal = MemoryJournal()
        async with open_engine(journal, clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(doc, speculation=policy)
            result = await run.wait()
            return dict(result.outputs), await journal.read(run.id), result.summary

    outputs, events, summary = virtual(lambda: go(capped))
    assert outputs == true_outputs({"steps": [{**s, "args": {**s["args"]}} for s in steps]})
    assert len([e for e in events if e.kind == "speculation_started"]) == 2
    assert summary["speculation"]["extra_cost_usd"] == pytest.approx(0.2)
    # The two thrown-away attempts' calls are speculation's extra calls; the real attempts' are not.
    spec = summary["speculation"]
    assert (spec["extra_model_calls"], spec["extra_tokens"]) == (2, 4)
    assert spec["total_extra_cost_usd"] == pytest.approx(0.2) and spec["head_start_s"] == 0
    assert summary["cost_usd"] == pytest.approx(0.1 * 7 + 0.2)  # the run's cost counts the thrown-away calls
    _outputs, uncapped, _summary = virtual(lambda: go(SpeculationSpec(mode="safe", min_confidence=0.0)))
    assert [e for e in uncapped if e.kind == "speculation_started"] == []


def test_the_timeline_marks_adopted_and_thrown_away_speculative_attempts() -> None:
    doc = {"steps": [
        {"id": "a", "tool": "f", "args": {"name": "a", "inputs": [], "seconds": 4.0}, "predict": "not-it"},
        {"id": "b", "tool": "f", "args": {"name": "b", "inputs": ["${a}"], "seconds": 4.0}},
        {"id": "c", "tool": "f", "args": {"name": "c", "inputs": [], "seconds": 4.0}},
        {"id": "d", "tool": "f", "args": {"name": "d", "inputs": ["${c}"], "seconds": 4.0}},
    ]}
    doc["steps"][2]["predict"] = true_outputs(doc)["c"]
    _outputs, _span, events = virtual(lambda: run_doc(doc, Calls().toolbox(), ANY_TIME))
    state = RunState.from_events(events[0].run_id, events)
    assert state.records["d"].speculative and not state.records["b"].speculative
    assert state.records["d"].started_at == 0.0  # its speculative start counts
    rows = {line.split(" ")[0]: line for line in timeline(state, 60).plain.splitlines()}
    assert "╌" in rows["b"] and "█" in rows["b"]  # thrown away at 4 s, then the real attempt
    assert rows["d"].rstrip().endswith("≈")
    assert "≈" not in rows["b"] and "╌" not in rows["d"]


def test_a_producer_called_again_with_the_same_arguments_is_predicted_from_the_runs_history() -> None:
    """``again`` calls the tool as ``first`` did: while it runs, ``use`` starts on ``first``'s output (history) and
    is adopted when ``again`` ends; nothing in the plan predicts anything."""
    calls = Calls()
    same = {"name": "p", "inputs": [], "seconds": 1.0}
    doc = {"steps": [
        {"id": "first", "tool": "f", "args": same},
        {"id": "wait", "tool": "f", "args": {"name": "w", "inputs": [], "seconds": 3.0}},
        {"id": "again", "tool": "f", "args": same, "after": ["wait"]},
        {"id": "use", "tool": "f", "args": {"name": "u", "inputs": ["${again}"], "seconds": 1.0}},
    ]}
    outputs, span, events = virtual(lambda: run_doc(doc, calls.toolbox(), SpeculationSpec(mode="safe")))
    assert outputs["use"] == digest("u", [digest("p", [])])
    started = [(e.step, e.at, dict(e.data["basis"])) for e in events if e.kind == "speculation_started"]
    assert started == [("use", 3.0, {"again": "history"})]
    assert kinds(events).count(("speculation_adopted", "use")) == 1
    assert span == 4.0  # not 5: use ran beside again
    assert calls.starts["u"] == [3.0]


@st.composite
def interrupted_workloads(draw: st.DrawFn) -> tuple[dict[str, Any], int | None, float, str]:
    doc, concurrency, _accuracy = draw(workloads())
    for step in doc["steps"]:  # an attempt cut by the interruption counts: room for it beside the planned flake
        step["retries"] = {"max": 2, "backoff": 0.5, "jitter": 0}
    return doc, concurrency, draw(st.sampled_from([0.25, 0.5, 1.0, 1.75, 3.0])), draw(st.sampled_from(["safe",
                                                                                                       "eager"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interrupted_workloads())
def test_a_run_interrupted_during_speculation_resumes_to_the_same_outputs(
    case: tuple[dict[str, Any], int | None, float, str],
) -> None:
    doc, concurrency, at, mode = case
    policy = SpeculationSpec(mode=mode, max_parallel=1000, min_confidence=0.0)
    journal = MemoryJournal()
    box = Calls().toolbox()  # one tool for both processes: a call that flaked once does not flake again

    async def interrupted() -> tuple[str, bool]:
        async with open_engine(journal, clock=VirtualClock(), tools=box, concurrency=concurrency) as engine:
            run = await engine.start(doc, speculation=policy)
            await asyncio.sleep(at)
            return run.id, run.finished  # leaving the engine interrupts the run

    async def resumed(run_id: str) -> dict[str, Any]:
        async with open_engine(journal, clock=VirtualClock(), tools=box, concurrency=concurrency) as engine:
            result = await (await engine.resume(run_id)).wait()
            assert result.status == "succeeded", result.error
            return dict(result.outputs)

    run_id, finished = virtual(interrupted)
    if finished:
        return
    assert virtual(lambda: resumed(run_id)) == true_outputs(doc)
    succeeded = [e.step for e in virtual(lambda: journal.read(run_id)) if e.kind == "step_succeeded"]
    assert len(succeeded) == len(set(succeeded)) == len(doc["steps"])
