"""Plan.slack: the seconds each step may start late, from the steps' estimates (all zero without any)."""

from __future__ import annotations

from typing import Any

from planweave import parse_plan_document, validate_plan
from planweave.core.plan.critical import slacks

STEPS: list[dict[str, Any]] = [{"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "after": ["a"]},
         {"id": "c", "tool": "noop", "after": ["a"]}, {"id": "d", "tool": "noop", "after": ["b", "c"]}]


def test_without_estimates_every_slack_is_zero() -> None:
    plan = validate_plan(parse_plan_document({"steps": STEPS}))
    assert dict(plan.slack) == dict.fromkeys("abcd", 0.0)


def test_with_estimates_slack_is_the_time_off_the_critical_path() -> None:
    timed = [{**s, "estimate": {"duration": d}} for s, d in zip(STEPS, (1.0, 5.0, 2.0, 1.0), strict=True)]
    plan = validate_plan(parse_plan_document({"steps": timed}))
    assert dict(plan.slack) == {"a": 0.0, "b": 0.0, "c": 3.0, "d": 0.0}
    durations = {sid: plan.steps[sid].duration_estimate for sid in plan.order}
    assert dict(plan.slack) == slacks(plan.order, plan.deps, plan.rank, durations, plan.makespan_lower_bound)
