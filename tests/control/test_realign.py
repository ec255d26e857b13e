"""The pure core of the control loop: realignment strategies, splicing into the action plan, the trigger."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planweave.control import (
    ActionPlan,
    Aligned,
    Chunk,
    CustomRealign,
    DropExpired,
    InferenceTrigger,
    LatencyEstimate,
    Nearest,
    RollForward,
    blend,
)


def chunk(actions: list[float], start: int, *, observed: int | None = None, arrived: int = 0) -> Chunk:
    return Chunk(1, tuple(actions), start, start if observed is None else observed, 0.0, arrived, 0.0)


def test_drop_expired_discards_the_actions_whose_tick_has_passed() -> None:
    aligned = DropExpired().align(chunk([10, 11, 12, 13, 14], start=10), now_tick=13, obs=None)
    assert aligned == Aligned((13, 14), 13, 2 + 1)


def test_drop_expired_keeps_a_chunk_meant_for_the_future_whole() -> None:
    assert DropExpired().align(chunk([20, 21], start=20), now_tick=18, obs=None) == Aligned((20, 21), 20, 0)


def test_drop_expired_of_a_chunk_entirely_past_leaves_nothing() -> None:
    assert DropExpired().align(chunk([1, 2], start=1), now_tick=9, obs=None) == Aligned((), 9, 2)


def test_rollforward_conditions_on_the_state_rolled_forward_with_the_pending_actions() -> None:
    rf = RollForward(lambda position, velocity: position + velocity)
    state, start = rf.condition(obs=100, tick=40, pending=[1, 2, 3, 4, 5], latency_ticks=3)
    assert (state, start) == (106, 43)  # 100 + 1 + 2 + 3, and the chunk is for the tick it will arrive at


def test_rollforward_refuses_to_roll_past_the_pending_actions() -> None:
    with pytest.raises(ValueError, match="needs 4 pending actions"):
        RollForward(lambda s, a: s).condition(0, 0, [1, 2], latency_ticks=4)


def test_nearest_resumes_after_the_waypoint_nearest_the_present_state() -> None:
    waypoints = [0.0, 1.0, 2.0, 3.0, 4.0]
    near = Nearest(lambda position, waypoint: abs(position - waypoint))
    assert near.align(chunk(waypoints, start=0), now_tick=7, obs=2.2) == Aligned((3.0, 4.0), 7, 3)
    # past the last waypoint: the last one stays the goal
    assert near.align(chunk(waypoints, start=0), now_tick=7, obs=9.0) == Aligned((4.0,), 7, 4)


def test_a_user_function_realigns_and_a_wrong_return_is_named() -> None:
    keep_two = CustomRealign(lambda c, now, obs: Aligned(c.actions[-2:], now, len(c.actions) - 2), "last_two")
    assert keep_two.align(chunk([1, 2, 3], start=0), 5, None) == Aligned((2, 3), 5, 1)
    bad = CustomRealign(lambda c, now, obs: c.actions, "bad")  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="realign function 'bad' returned tuple"):
        bad.align(chunk([1], start=0), 0, None)


def test_blend_cross_fades_the_first_actions_from_the_old_chunk() -> None:
    assert blend([0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0], steps=2) == (1.0, 2.0, 3.0, 3.0)
    assert blend([(0.0, 4.0)], [(4.0, 0.0)], steps=1) == ((2.0, 2.0),)


def test_splice_keeps_the_current_actions_before_a_chunk_meant_for_later() -> None:
    plan = ActionPlan()
    plan.splice(Aligned((10, 11, 12, 13), 10, 0), chunk([], 10))
    superseded = plan.splice(Aligned((112, 113, 114), 12, 0), Chunk(2, (), 12, 9, 0.5, 11, 0.6))
    assert superseded == 2
    assert [plan.action_at(t) for t in range(10, 16)] == [
        (10, 1, 0.0), (11, 1, 0.0), (112, 2, 0.5), (113, 2, 0.5), (114, 2, 0.5), None]


@given(old=st.lists(st.integers(), max_size=12), old_start=st.integers(0, 30),
       new=st.lists(st.integers(), max_size=12), new_start=st.integers(0, 40))
def test_splice_runs_the_new_chunk_from_its_start_and_keeps_the_old_before_it(
        old: list[int], old_start: int, new: list[int], new_start: int) -> None:
    plan = ActionPlan()
    plan.splice(Aligned(tuple(old), old_start, 0), chunk([], old_start))
    plan.splice(Aligned(tuple(new), new_start, 0), Chunk(2, (), new_start, 0, 0.0, 0, 0.0))
    for tick in range(0, 60):
        planned = plan.action_at(tick)
        if new_start <= tick < new_start + len(new):
            assert planned == (new[tick - new_start], 2, 0.0)
        elif tick >= new_start + len(new):
            assert planned is None
        elif old_start <= tick < old_start + len(old) and new_start <= old_start + len(old):
            assert planned is not None and planned[0] == old[tick - old_start]  # contiguous: the old is kept
        else:
            assert planned is None


def test_trigger_every_k_ticks_and_below_m_remaining() -> None:
    every = InferenceTrigger(every=4)
    assert every.due(0, 10, None, False)  # no request yet
    assert not every.due(3, 10, 0, False) and every.due(4, 10, 0, False)
    assert not every.due(9, 10, 0, True)  # one in flight: wait for it
    below = InferenceTrigger(below=3)
    assert not below.due(5, 3, 0, False) and below.due(5, 2, 0, False)
    assert below.due(5, 0, 0, False)  # nothing planned: ask at once


def test_trigger_needs_a_rule_and_positive_numbers() -> None:
    with pytest.raises(ValueError, match="needs every=K"):
        InferenceTrigger()
    with pytest.raises(ValueError, match="below=0"):
        InferenceTrigger(below=0)


def test_latency_estimate_rounds_up_to_whole_ticks() -> None:
    estimate = LatencyEstimate(0.0, dt=0.02)
    assert estimate.ticks == 0
    estimate.observe(0.15)
    assert estimate.ticks == 8
    estimate.observe(0.16)
    assert estimate.ticks == 8
