"""The journaled plan document: plain steps are written by hand, and exactly as pydantic's dump writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planweave import parse_plan_document, validate_plan
from planweave.core.plan.model import PlanSpec, Step

PLANS: list[dict[str, Any]] = [
    {"steps": []},
    {"steps": [{"id": "a", "tool": "noop"}]},
    {"name": "n", "$schema": "https://example.org/plan.json", "capacities": {"llm": 2}, "concurrency": 3,
     "defaults": {"timeout": None, "retries": 2}, "steps": [
         {"id": "a", "tool": "noop", "args": {"x": 1, "nested": [1, 2.5, None, True, {"k": "v"}]}},
         {"id": "b", "tool": "noop", "args": {}, "after": [], "description": ""},  # defaults written out: dropped
         {"id": "c", "tool": "noop", "after": ["a", "b"], "description": "joins"},
         {"id": "d", "tool": "noop", "args": {"y": "${a.x}", "t": "at ${c}"}, "timeout": None, "retries": 0},
         {"id": "e", "tool": "noop", "resources": {"llm": 1}, "writes": ["./out/../f"], "estimate": {"duration": 2}},
         {"id": "f", "tool": "noop", "fallback": {"tool": "noop", "args": {"z": 1}}, "approval": "ok?"},
     ]},
]


def reference(spec: PlanSpec) -> dict[str, Any]:
    """What pydantic writes for the plan, with the defaultable keys a step or the defaults set on purpose."""
    document = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    for written, step in zip(document["steps"], spec.steps, strict=True):
        chosen = {"timeout", "heartbeat", "retries"} & step.model_fields_set
        for name, value in step.model_dump(mode="json", include=chosen).items():
            written.setdefault(name, value)
    if spec.defaults.model_fields_set:
        document["defaults"] = spec.defaults.model_dump(mode="json", exclude_unset=True)
    return document


@pytest.mark.parametrize("doc", PLANS)
def test_document_is_pydantics_dump_byte_for_byte(doc: dict[str, Any]) -> None:
    spec = parse_plan_document(doc)
    written = validate_plan(spec).to_document()
    assert json.dumps(written) == json.dumps(reference(spec))  # the same keys, in the same order
    again = validate_plan(parse_plan_document(json.loads(json.dumps(written))))
    assert again.spec == spec


@pytest.mark.parametrize("args", [
    {"pair": (1, 2)}, {"deep": {"t": ("a", [("b",)])}}, {"when": float("inf")}, {"not": float("nan")},
    {"big": 10**30}, {"raw": b"bytes"}, {"set": {1}},
])
def test_arguments_pydantic_converts_are_converted_as_pydantic_does(args: dict[str, Any]) -> None:
    # A PlanSpec built in Python skips the document checks of plan files: tuples, bytes, non-finite floats.
    spec = PlanSpec(steps=(Step(id="a", tool="noop", args=args),))
    assert validate_plan(spec).to_document() == reference(spec)


def test_the_document_does_not_share_the_specs_arguments() -> None:
    spec = parse_plan_document({"steps": [{"id": "a", "tool": "noop", "args": {"x": {"y": [1]}}}]})
    written = validate_plan(spec).to_document()
    written["steps"][0]["args"]["x"]["y"].append(2)
    assert spec.steps[0].args == {"x": {"y": [1]}}
