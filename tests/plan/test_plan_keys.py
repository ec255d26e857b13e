"""Plan keys for approvals, isolation, failure policy and defaults; every duration in a plan is finite."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from planweave import PlanInvalid, builtin_tools, parse_plan_document, validate_plan
from planweave.core.plan.model import RetryPolicy

BASE: dict[str, Any] = {"steps": [
    {"id": "a", "tool": "noop", "args": {"x": 1}},
    {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}, "timeout": 5},
]}


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(PlanInvalid) as info:
        validate_plan(parse_plan_document(doc), builtin_tools(), {})
    return [str(p) for p in info.value.problems]


def test_new_keys_are_read() -> None:
    spec = parse_plan_document({
        "on_failure": "continue",
        "defaults": {"timeout": 30, "retries": 2, "heartbeat": 5},
        "steps": [
            {"id": "a", "tool": "noop", "approval": "Deploy to production?", "isolation": "process"},
            {"id": "b", "tool": "noop", "approval": True, "isolation": "thread"},
        ],
    })
    assert spec.on_failure == "continue"
    assert spec.defaults.retries == RetryPolicy(max=2)
    assert [s.approval for s in spec.steps] == ["Deploy to production?", True]
    assert [s.isolation for s in spec.steps] == ["process", "thread"]


def test_bad_values_of_new_keys_name_the_field() -> None:
    found = problems({
        "on_failure": "ignore",
        "defaults": {"timeuot": 3},
        "steps": [{"id": "a", "tool": "noop", "isolation": "fork", "approval": " "}],
    })
    joined = "\n".join(found)
    assert "step 'a', isolation:" in joined
    assert "step 'a', approval:" in joined
    assert "on_failure:" in joined
    assert "defaults.timeuot: unknown key" in joined


def test_plans_without_new_keys_keep_their_fingerprints_and_documents() -> None:
    plain = validate_plan(parse_plan_document(BASE))
    with_keys = validate_plan(parse_plan_document({
        "on_failure": "stop",
        "steps": [{**BASE["steps"][0], "approval": True, "isolation": "process"}, BASE["steps"][1]],
    }))
    # Fingerprints hash the work (tool, arguments, inputs), not how it is run or approved.
    assert dict(plain.fingerprints) == dict(with_keys.fingerprints)
    assert plain.fingerprints["b"] == "b3b3e15911e6aa5b70cc1477dea34dcf"
    assert plain.to_document() == BASE  # unset keys stay out of the journaled document


@pytest.mark.parametrize("where", [
    ("timeout",), ("heartbeat",), ("estimate", "duration"), ("estimate", "cost"),
    ("retries", "backoff"), ("retries", "max_backoff"), ("retries", "factor"), ("retries", "jitter"),
])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308])
def test_durations_must_be_finite(where: tuple[str, ...], value: float) -> None:
    step: dict[str, Any] = {"id": "a", "tool": "noop"}
    if len(where) == 1:
        step[where[0]] = value
    else:
        step[where[0]] = {where[1]: value}
    found = problems({"steps": [step]})
    assert len(found) == 1
    assert found[0].startswith(f"step 'a', {'.'.join(where)}: ")


@pytest.mark.parametrize("key", ["timeout", "heartbeat"])
def test_defaults_must_be_finite(key: str) -> None:
    for value in (math.inf, math.nan, 1e308):
        assert problems({"defaults": {key: value}, "steps": []})[0].startswith(f"defaults.{key}: ")


def test_json_infinity_is_refused() -> None:
    doc = json.loads('{"steps": [{"id": "a", "tool": "noop", "timeout": Infinity}]}')
    assert problems(doc) == ["step 'a', timeout: Input should be a finite number"]


def test_retry_delay_does_not_overflow() -> None:
    policy = RetryPolicy(max=1000, backoff=1, factor=1000, max_backoff=30, jitter=0)
    assert policy.delay(1000, 0.5) == 30
