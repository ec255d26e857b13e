"""The ``sleep`` tool takes a finite, bounded number of seconds: anything else is refused when the plan is checked."""

from __future__ import annotations

import math

import pytest

from planweave import builtin_tools
from planweave.core.errors import PlanInvalid
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.plan.model import MAX_SECONDS


def check(seconds: object) -> None:
    spec = parse_plan_document({"steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": seconds}}]}, "plan.yaml")
    validate_plan(spec, builtin_tools(), {}, source="plan.yaml")


@pytest.mark.parametrize(("seconds", "says"), [
    (math.inf, "finite"),
    (-math.inf, "finite"),
    (math.nan, "finite"),
    (1e308, f"at most {MAX_SECONDS:g}"),
    (-1, "at least 0"),
])
def test_sleep_refuses_seconds_that_are_not_a_sane_duration(seconds: float, says: str) -> None:
    with pytest.raises(PlanInvalid) as caught:
        check(seconds)
    text = str(caught.value)
    assert "nap" in text and "seconds" in text and says in text, text
    assert "Traceback" not in text


@pytest.mark.parametrize("seconds", [0, 0.5, 3 * 365 * 86400.0, MAX_SECONDS])
def test_sleep_accepts_finite_durations_up_to_the_plan_limit(seconds: float) -> None:
    check(seconds)
