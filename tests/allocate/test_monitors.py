"""The pure monitors and the cascade: when each monitor fires, and the cascade's invariants (property tests)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planweave.allocate.cascade import Cascade
from planweave.allocate.monitors import (
    Fire,
    LowConfidenceMonitor,
    MilestoneMonitor,
    MonitorSet,
    Signal,
    StuckMonitor,
    logprob_margin,
    reported_confidence,
)


# -- stuck ------------------------------------------------------------------------------------------------------------
def test_stuck_fires_on_the_nth_failure_in_a_row_and_a_success_starts_the_count_again() -> None:
    stuck = StuckMonitor(failures=3)
    assert stuck.observe(Signal("failed", 1.0, detail="timeout")) is None
    assert stuck.observe(Signal("failed", 2.0, detail="timeout")) is None
    assert stuck.observe(Signal("succeeded", 3.0)) is None
    assert stuck.observe(Signal("failed", 4.0)) is None
    assert stuck.observe(Signal("failed", 5.0)) is None
    fire = stuck.observe(Signal("failed", 6.0, detail="provider_error"))
    assert fire == Fire("stuck", "3 failures in a row (last: provider_error)")
    assert stuck.observe(Signal("failed", 7.0)) is None  # counted again from the fire


def test_stuck_fires_after_silence_in_a_started_attempt_only() -> None:
    stuck = StuckMonitor(failures=None, silence_s=5.0)
    assert stuck.due() is None and stuck.check(100.0) is None  # nothing running: no silence to watch
    stuck.observe(Signal("started", 10.0))
    assert stuck.due() == 15.0
    stuck.observe(Signal("progress", 12.0))
    assert stuck.due() == 17.0
    assert stuck.check(16.9) is None
    assert stuck.check(17.0) == Fire("stuck", "no progress for 5 s")
    assert stuck.due() is None  # reset by the fire
    stuck.observe(Signal("started", 20.0))
    stuck.observe(Signal("succeeded", 21.0))
    assert stuck.check(1000.0) is None


def test_stuck_fires_on_the_same_action_repeated() -> None:
    stuck = StuckMonitor(failures=None, repeats=3)
    for key in ("click A", "click A", "click B", "click B"):
        assert stuck.observe(Signal("action", 0.0, key=key)) is None
    fire = stuck.observe(Signal("action", 0.0, key="click B"))
    assert fire is not None and fire.monitor == "stuck" and "3 times" in fire.reason and "click B" in fire.reason


def test_monitors_refuse_bad_settings_naming_them() -> None:
    with pytest.raises(ValueError, match="failures must be at least 1"):
        StuckMonitor(failures=0)
    with pytest.raises(ValueError, match="silence_s must be positive"):
        StuckMonitor(silence_s=0)
    with pytest.raises(ValueError, match="threshold must be in"):
        LowConfidenceMonitor(1.5)


# -- milestone and low confidence -----------------------------------------------------------------------------------
def test_milestone_fires_on_a_rejected_output_only() -> None:
    milestone = MilestoneMonitor()
    assert milestone.observe(Signal("failed", 0.0, detail="timeout")) is None
    assert milestone.observe(Signal("succeeded", 0.0)) is None
    fire = milestone.observe(Signal("rejected", 0.0, key="schema", detail="missing 'answer'"))
    assert fire == Fire("milestone", "schema failed: missing 'answer'")


def test_low_confidence_fires_below_the_threshold_and_never_without_a_confidence() -> None:
    low = LowConfidenceMonitor(0.6)
    assert low.observe(Signal("confidence", 0.0, value=None)) is None
    assert low.observe(Signal("confidence", 0.0, value=0.6)) is None
    fire = low.observe(Signal("confidence", 0.0, value=0.59, key="logprobs"))
    assert fire is not None and fire.monitor == "low_confidence" and "0.590" in fire.reason


def test_confidence_from_logprobs_and_from_the_answer() -> None:
    sure = [[math.log(0.99), math.log(0.005)]] * 4
    unsure = [[math.log(0.4), math.log(0.35)]] * 4
    sure_margin, unsure_margin = logprob_margin(sure), logprob_margin(unsure)
    assert sure_margin is not None and unsure_margin is not None
    assert sure_margin == pytest.approx(0.985) and unsure_margin == pytest.approx(0.05)
    assert logprob_margin([[0.0]]) == pytest.approx(1.0)  # one alternative: certain
    assert logprob_margin([]) is None
    assert reported_confidence({"answer": "x", "confidence": 0.3}) == 0.3
    assert reported_confidence({"confidence": 85}) == 0.85
    assert reported_confidence({"confidence": "high"}) is None
    assert reported_confidence({"confidence": True}) is None
    assert reported_confidence("text") is None


def test_a_monitor_set_answers_the_first_fire_and_resets_the_others() -> None:
    stuck = StuckMonitor(failures=2)
    both = MonitorSet([MilestoneMonitor(), stuck])
    assert both.observe(Signal("failed", 0.0)) is None
    # a rejection fires the milestone monitor; the stuck count starts again, so the next failure does not fire
    assert both.observe(Signal("rejected", 1.0, key="schema")) is not None
    assert both.observe(Signal("failed", 2.0)) is None
    fire = both.observe(Signal("failed", 3.0))
    assert fire is not None and fire.monitor == "stuck"


# -- the cascade ------------------------------------------------------------------------------------------------------
def test_a_cascade_escalates_the_step_that_fired_and_deescalates_after_a_streak() -> None:
    cascade = Cascade(["small", "medium", "large"], streak=2)
    assert cascade.tier_for("a") == "small"
    shift = cascade.fired("a", Fire("milestone", "schema failed"))
    assert shift is not None and (shift.rung, shift.from_tier, shift.to_tier, shift.monitor) == (
        "escalate", "small", "medium", "milestone")
    assert cascade.tier_for("a") == "medium" and cascade.tier == "medium"  # new steps start there too
    assert cascade.succeeded("a") is None
    down = cascade.succeeded("b")
    assert down is not None and (down.rung, down.from_tier, down.to_tier, down.monitor) == (
        "deescalate", "medium", "small", None)
    assert cascade.tier == "small"


def test_a_step_keeps_its_floor_until_it_succeeds() -> None:
    cascade = Cascade(["small", "large"], streak=1)
    cascade.fired("a", Fire("stuck", "2 failures"))
    assert cascade.succeeded("b") is not None  # b's success brings new steps back to small...
    assert cascade.tier == "small" and cascade.tier_for("a") == "large"  # ...but a's retry stays on large
    cascade.succeeded("a")
    assert cascade.tier_for("a") == "small"


def test_at_the_strongest_tier_a_fire_has_nowhere_to_go() -> None:
    cascade = Cascade(["small", "large"])
    assert cascade.fired("a", Fire("stuck", "x")) is not None
    assert cascade.fired("a", Fire("stuck", "x")) is None
    assert cascade.tier_for("a") == "large"


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, str]]]:
    tiers = draw(st.integers(1, 4))
    streak = draw(st.integers(1, 4))
    ops = draw(st.lists(st.tuples(st.sampled_from(["fire", "fail", "ok"]), st.sampled_from(["a", "b", "c"])),
                        max_size=60))
    return tiers, streak, ops


@given(histories())
def test_cascade_invariants(history: tuple[int, int, list[tuple[str, str]]]) -> None:
    n, streak, ops = history
    cascade = Cascade([f"t{i}" for i in range(n)], streak=streak)
    run = 0  # successes in a row, as this test counts them
    for op, step in ops:
        before = (cascade.index, {s: cascade.index_for(s) for s in "abc"})
        if op == "fire":
            shift = cascade.fired(step, Fire("stuck", "x"))
            run = 0
            assert shift is None or shift.rung == "escalate"
            if shift is not None:
                assert cascade.tiers.index(shift.to_tier) == cascade.tiers.index(shift.from_tier) + 1
        elif op == "fail":
            cascade.failed(step)
            run = 0
            assert cascade.index == before[0]  # never escalates without a fire
            assert all(cascade.index_for(s) == i for s, i in before[1].items())
        else:
            shift = cascade.succeeded(step)
            run += 1
            assert cascade.index <= before[0]  # a success never escalates
            if shift is not None:
                assert shift.rung == "deescalate" and run >= streak  # only after a streak
                assert cascade.index == before[0] - 1
                run = 0
            elif cascade.index < before[0]:
                raise AssertionError("the index fell without a deescalate shift")
        assert 0 <= cascade.index < n
        assert all(0 <= cascade.index_for(s) < n for s in "abc")


def test_the_monitors_and_the_cascade_are_pure() -> None:
    """No I/O and no adapter: they import the standard library's data helpers and each other only."""
    import ast
    from pathlib import Path

    import planweave.allocate.cascade as cascade_module
    import planweave.allocate.monitors as monitors_module

    allowed = {"__future__", "math", "collections.abc", "dataclasses", "typing", "planweave.allocate.monitors"}
    for module in (monitors_module, cascade_module):
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert names <= allowed, f"{module.__name__} imports {sorted(names - allowed)}"


@given(st.integers(1, 4), st.lists(st.sampled_from(["failed", "succeeded", "progress"]), max_size=40))
def test_stuck_fires_exactly_at_the_nth_failure_in_a_row(failures: int, kinds: list[str]) -> None:
    stuck = StuckMonitor(failures=failures, repeats=None)
    run = 0
    for i, kind in enumerate(kinds):
        fire = stuck.observe(Signal(kind, float(i)))  # type: ignore[arg-type]
        if kind == "failed":
            run += 1
        elif kind == "succeeded":
            run = 0
        assert (fire is not None) == (run == failures)
        if fire is not None:
            run = 0


@given(st.floats(0, 1), st.lists(st.floats(0, 1) | st.none(), max_size=20))
def test_low_confidence_never_fires_at_or_above_its_threshold(threshold: float, values: list[float | None]) -> None:
    low = LowConfidenceMonitor(threshold)
    for value in values:
        fire = low.observe(Signal("confidence", 0.0, value=value))
        assert (fire is not None) == (value is not None and value < threshold)


@given(st.floats(0.1, 100), st.lists(st.floats(0, 50), min_size=1, max_size=10), st.floats(0, 200))
def test_silence_fires_only_once_the_silence_has_lasted(silence: float, gaps: list[float], wait: float) -> None:
    stuck = StuckMonitor(failures=None, silence_s=silence)
    now = 0.0
    stuck.observe(Signal("started", now))
    for gap in gaps:  # progress at each gap that is shorter than the silence
        if gap >= silence:
            break
        now += gap
        stuck.observe(Signal("progress", now))
    fire = stuck.check(now + wait)
    assert (fire is not None) == (now + wait >= now + silence)  # as the clock adds them
