"""Deadline pressure: the pure policy (threshold, hysteresis, which steps may be dropped) and, on the virtual clock
through the real engine and its live forecast, optional steps dropped when the forecast falls below the threshold."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planweave import Tool, Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.allocate.pressure import REARM_MARGIN, PressureError, PressureMonitor, droppable, policy_for
from planweave.allocate.pressure_watch import PressureWatch
from planweave.core.errors import PlanInvalid, RunError
from planweave.core.events import Event
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.plan.model import DeadlinePressure
from planweave.core.state import RunState
from planweave.engine.runtime import cancel_at_deadline
from planweave.forecast.live import LiveOptions, start_live_forecast


def policy(threshold: float = 0.5, *actions: str) -> DeadlinePressure:
    return DeadlinePressure.model_validate({"p_deadline": threshold, **({"actions": list(actions)} if actions
                                                                         else {})})


def forecasts(monitor: PressureMonitor, ps: Sequence[float | None]) -> list[int]:
    """The indexes of the forecasts that fired."""
    return [i for i, p in enumerate(ps) if monitor.observe({"p_deadline": p, "deadline": 10.0, "elapsed": 4.0})]


# -- the pure policy -------------------------------------------------------------------------------------------------
def test_pressure_fires_when_p_deadline_falls_below_the_threshold_and_once_per_crossing() -> None:
    monitor = PressureMonitor(policy(0.5))
    assert forecasts(monitor, [0.9, 0.6, 0.5, 0.49, 0.3, 0.1, 0.55, 0.45, 0.61, 0.2, None, 0.7, 0.1]) == [3, 9, 12]
    assert monitor.crossings == 3


def test_a_fired_pressure_carries_the_actions_the_probability_and_the_time_left() -> None:
    monitor = PressureMonitor(policy(0.8, "drop_optional", "faster_tiers"))
    fired = monitor.observe({"p_deadline": 0.25, "deadline": 30.0, "elapsed": 12.5})
    assert fired is not None
    assert (fired.actions, fired.p_deadline, fired.threshold, fired.remaining_s) == (
        ("drop_optional", "faster_tiers"), 0.25, 0.8, 17.5)
    assert fired.journaled("drop_optional", steps=["x"]) == {
        "rung": "deadline_pressure", "action": "drop_optional", "p_deadline": 0.25, "threshold": 0.8, "crossing": 1,
        "remaining_s": 17.5, "steps": ["x"]}


def test_a_forecast_without_a_deadline_never_fires() -> None:
    monitor = PressureMonitor(policy(1.0))
    assert forecasts(monitor, [None, None]) == []
    assert monitor.observe({"p_deadline": "0.1"}) is None and monitor.observe({}) is None


@settings(max_examples=300, deadline=None)
@given(threshold=st.floats(0.01, 1.0), ps=st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=60))
def test_pressure_never_fires_at_or_above_the_threshold_and_re_arms_only_clear_of_it(
        threshold: float, ps: list[float | None]) -> None:
    monitor = PressureMonitor(policy(threshold))
    fired = forecasts(monitor, ps)
    seen = [p for p in ps if p is not None]
    assert all((p := ps[i]) is not None and p < threshold for i in fired)
    for before, after in itertools.pairwise(fired):  # between two firings, p climbed back clear of it
        assert any(p is not None and p >= min(1.0, threshold + REARM_MARGIN) for p in ps[before + 1:after])
    first_below = next((i for i, p in enumerate(ps) if p is not None and p < threshold), None)
    assert (fired[0] if fired else None) == first_below  # the first fall below fires at once
    assert monitor.crossings == len(fired) <= len(seen)


def test_the_command_line_threshold_replaces_the_plans_and_a_bad_one_is_named() -> None:
    assert policy_for(None, None) is None  # off unless asked
    from_flag = policy_for(None, 0.3)
    assert from_flag is not None and from_flag.p_deadline == 0.3
    assert from_flag.actions == ("faster_tiers", "drop_optional", "replan")
    kept = policy_for(policy(0.9, "drop_optional"), 0.2)
    assert kept is not None and (kept.p_deadline, kept.actions) == (0.2, ("drop_optional",))
    for bad in (0.0, 1.5, float("nan"), True):
        with pytest.raises(PressureError, match=r"--deadline-pressure: expected a probability"):
            policy_for(None, bad)


@pytest.mark.parametrize(("pressure", "message"), [
    ({"p_deadline": 0}, "pressure.p_deadline"),
    ({"actions": []}, "pressure.actions"),
    ({"actions": ["drop_optional", "drop_optional"]}, "names 'drop_optional' more than once"),
    ({"actions": ["panic"]}, "pressure.actions.0"),
])
def test_a_bad_pressure_section_is_refused_naming_the_field(pressure: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanInvalid, match=message.replace(".", r"\.")):
        parse_plan_document({"steps": [{"id": "a", "tool": "noop"}], "pressure": pressure}, "plan.yaml")


def test_optional_must_be_a_boolean() -> None:
    with pytest.raises(PlanInvalid, match="step 'a', optional: Input should be a valid boolean"):
        parse_plan_document({"steps": [{"id": "a", "tool": "noop", "optional": "maybe"}]}, "plan.yaml")


def test_only_optional_steps_that_no_required_step_needs_may_be_dropped() -> None:
    plan = validate_plan(parse_plan_document({"steps": [
        {"id": "a", "tool": "noop"},
        {"id": "polish", "tool": "noop", "optional": True, "after": ["a"]},
        {"id": "polish_more", "tool": "noop", "optional": True, "after": ["polish"]},
        {"id": "prep", "tool": "noop", "optional": True},  # optional, but 'report' needs it
        {"id": "report", "tool": "noop", "after": ["prep", "a"]},
        {"id": "aside", "tool": "noop", "optional": True, "after": ["prep"]},
    ]}, "test"), builtin_tools())
    state = RunState("r", plan, [])
    assert set(droppable(plan, state)) == {"polish", "polish_more", "aside"}
    state.records["polish"].status = "succeeded"  # finished work is never dropped
    assert set(droppable(plan, state)) == {"polish_more", "aside"}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 12))
def test_a_dropped_step_is_never_needed_by_a_required_one(data: st.DataObject, n: int) -> None:
    steps = []
    for i in range(n):
        after = data.draw(st.lists(st.sampled_from([f"s{j}" for j in range(i)]), unique=True, max_size=3)
                          if i else st.just([]))
        steps.append({"id": f"s{i}", "tool": "noop", "after": after, "optional": data.draw(st.booleans())})
    plan = validate_plan(parse_plan_document({"steps": steps}, "test"), builtin_tools())
    state = RunState("r", plan, [])
    dropped = set(droppable(plan, state))
    required = {sid for sid in plan.order if not plan.steps[sid].optional}
    needed = required | {d for sid in required for d in _ancestors(plan, sid)}  # what they need, transitively
    assert not dropped & needed
    assert dropped == set(plan.order) - needed  # every other (optional, unfinished) step is dropped


def _ancestors(plan: Any, sid: str) -> set[str]:
    found: set[str] = set()
    stack = list(plan.deps[sid])
    while stack:
        dep = stack.pop()
        if dep not in found:
            found.add(dep)
            stack.extend(plan.deps[dep])
    return found


# -- end to end on the virtual clock --------------------------------------------------------------------------------
def sleeping(sid: str, seconds: float, estimate: float, after: Sequence[str] = (), tool: str = "sleep",
             **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": tool, "args": {"seconds": seconds, "result": f"{sid} done"}, "after": list(after),
            "estimate": {"duration": estimate}, **extra}


async def busy(seconds: float, result: Any = None) -> Any:
    """Sleep ``seconds``: a duration the forecast cannot read from the arguments (it reads ``sleep``'s as exact)."""
    await asyncio.sleep(seconds)
    return result


TOOLS = builtin_tools().merged(Toolbox({"busy": Tool.from_function(busy, name="busy", idempotent=True)}))


# 'a' is estimated at 2 s and takes 6: the first forecast (makespan 6 s) is in time for a 9 s deadline; once 'a' ends
# at 6, 'b' (2 s) fits and the optional 'extra' (4 s) does not: P(in time) falls to 0.
LATE = {"steps": [sleeping("a", 6, 2), sleeping("b", 2, 2, ["a"]),
                  sleeping("extra", 4, 4, ["a"], optional=True),
                  sleeping("extra_after", 1, 1, ["extra"], optional=True)]}
# The same with durations only the estimates speak for (the forecast takes a literal sleep's seconds as exact, so
# with LATE it knows at once that 'a' takes 6 s and drops the optional steps at 0).
LATE_HIDDEN = {"steps": [{**s, "tool": "busy"} for s in LATE["steps"]]}


def run_late(pressure: DeadlinePressure | None, deadline: float = 9.0, plan: Mapping[str, Any] = LATE_HIDDEN,
             ) -> tuple[str, dict[str, Any], RunState, list[Event], list[dict[str, Any]]]:
    taken: list[dict[str, Any]] = []

    async def go() -> tuple[str, dict[str, Any], RunState, list[Event]]:
        async with open_engine("memory://", clock=VirtualClock(), tools=TOOLS) as engine:
            run = await engine.start(plan, run_id="late")
            cancel_at_deadline(engine, run, deadline)
            live = start_live_forecast(engine, run, LiveOptions(deadline=deadline, runs=50, share=None))
            watch = PressureWatch(run, pressure) if pressure is not None else None
            result = await run.wait()
            await (await live).wait()
            if watch is not None:
                taken.extend(watch.taken)
            return result.status, dict(result.outputs), result.state, list(await engine.journal.read(run.id))

    status, outputs, state, events = run_virtual(go())
    return status, outputs, state, events, taken


def test_falling_below_the_threshold_drops_the_optional_steps_and_the_run_succeeds_in_time() -> None:
    status, outputs, state, events, taken = run_late(policy(0.5))
    assert status == "succeeded"
    assert outputs == {"a": "a done", "b": "b done"}  # the required steps' outputs, as without pressure
    assert state.records["extra"].status == "cancelled" and "deadline pressure" in str(state.records["extra"].error)
    assert state.records["extra_after"].status == "skipped"
    (escalation,) = [e for e in events if e.kind == "escalation"]
    assert escalation.at == 6.0 and escalation.data["action"] == "drop_optional"
    assert escalation.data["rung"] == "deadline_pressure" and escalation.data["steps"] == ["extra", "extra_after"]
    assert escalation.data["p_deadline"] < 0.5 == escalation.data["threshold"]
    assert escalation.data["remaining_s"] == 3.0
    assert escalation.data["reason"] == "P(in time) 0% below 50%: dropped the optional extra, extra_after"
    assert taken == [dict(escalation.data)]
    cancelled = next(e for e in events if e.kind == "step_cancelled")
    assert cancelled.step == "extra" and not cancelled.data.get("resumable")
    assert events.index(escalation) < events.index(cancelled)  # journaled before it is carried out
    finished = events[-1]
    assert finished.kind == "run_finished" and finished.at == 8.0


def test_without_pressure_the_same_run_is_stopped_by_its_deadline() -> None:
    status, outputs, state, events, taken = run_late(None)
    assert status == "cancelled" and "deadline of 9s reached" in str(state.error)
    assert "extra" not in outputs and not taken
    assert not [e for e in events if e.kind == "escalation"]


def test_pressure_that_only_replans_leaves_a_plan_run_alone() -> None:
    status, _, _, _, taken = run_late(policy(0.5, "replan"))
    assert status == "cancelled" and not taken  # a plan file has no planner: nothing to do, nothing journaled


def test_cancel_step_refuses_an_unknown_step_and_leaves_a_finished_one() -> None:
    async def go() -> tuple[bool, bool, RunState, float]:
        async with open_engine("memory://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await engine.start({"steps": [sleeping("a", 1, 1), sleeping("b", 5, 5, ["a"])]}, run_id="c")
            with pytest.raises(RunError, match="run 'c' has no step 'zz'"):
                run.cancel_step("zz", "no reason")
            await VirtualClock().sleep(2)  # 'a' ended at 1, 'b' runs
            again = run.cancel_step("a", "too late")
            dropped = run.cancel_step("b", "not needed")
            result = await run.wait()
            return again, dropped, result.state, engine.clock.now()

    again, dropped, state, ended = run_virtual(go())
    assert (again, dropped) == (False, True)
    assert state.status == "succeeded" and state.records["b"].status == "cancelled"
    assert ended == 2.0  # the run did not wait for the 5 s step it no longer needs
