"""Properties of the forecast over random plans (hypothesis): fixed durations give the critical path exactly, a
later deadline is never less likely, and the simulated makespan never beats the critical path."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave.forecast.estimates import Estimates, Observation, build_estimates
from planweave.forecast.simulate import forecast
from tests.forecast.test_simulate import plan_of


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 25))
    steps = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        seconds = draw(st.floats(0.0, 50.0, allow_nan=False).map(lambda x: round(x, 3)))
        steps.append({"id": f"s{i}", "tool": "sleep", "args": {"seconds": seconds},
                      "after": [f"s{p}" for p in parents], "estimate": {"duration": seconds},
                      "retries": {"max": draw(st.integers(0, 2)), "backoff": 1.0}})
    return {"steps": steps}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_fixed_durations_give_exactly_the_critical_path(doc: dict[str, Any]) -> None:
    plan = plan_of(doc)
    result = forecast(plan, Estimates(), runs=3, concurrency=None)
    assert result.makespan.p50 == result.makespan.p99
    assert abs(result.makespan.p50 - plan.makespan_lower_bound) <= 1e-9 * max(1.0, plan.makespan_lower_bound)
    assert result.p_success == 1.0


HISTORY = build_estimates(Observation("tool", "sleep", 1.0 + (i % 7), i % 5 != 0) for i in range(40))
# Five attempts of 1-5 s, none failed: sampled as they are (too few for a lognormal), certain success.
NO_FAILURES = build_estimates((Observation("tool", "sleep", 1.0 + i, True) for i in range(5)), prior=(1.0, 0.0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.floats(0.0, 200.0), st.floats(0.0, 200.0), st.integers(1, 8))
def test_a_later_deadline_is_never_less_likely_and_nothing_beats_the_critical_path(
        doc: dict[str, Any], first: float, second: float, concurrency: int) -> None:
    plan = plan_of(doc)
    early, late = sorted((first, second))
    a = forecast(plan, HISTORY, deadline=early, runs=50, seed=1, concurrency=concurrency)
    b = forecast(plan, HISTORY, deadline=late, runs=50, seed=1, concurrency=concurrency)
    assert a.p_deadline is not None and b.p_deadline is not None
    assert a.p_deadline <= b.p_deadline  # the same seed: the same simulated runs, judged against two deadlines
    assert a.makespan == b.makespan
    # Every attempt of that history lasts at least 1 s: no run of the steps (without the plan's estimates as a
    # prior) ends before the critical path of 1 s steps.
    bare = plan_of({"steps": [{k: v for k, v in s.items() if k != "estimate"} for s in doc["steps"]]})
    drawn = forecast(bare, NO_FAILURES, runs=50, seed=1, concurrency=concurrency)
    ones = forecast(plan_of({"steps": [{**s, "estimate": {"duration": 1.0}} for s in doc["steps"]]}),
                    Estimates(), runs=1, concurrency=None)
    assert drawn.p_success == 1.0
    assert min(start for start, _ in drawn.histogram) >= ones.makespan.p50 - 1e-9
