"""The committed JSON Schema matches the model, and example plans validate against it."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from planweave.core.plan.schema import SCHEMA_PATH, plan_json_schema, render_schema

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schema_is_current() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render_schema(), (
        "run `python -m planweave.core.plan.schema` to regenerate src/planweave/schemas/plan.schema.json"
    )


def test_examples_follow_the_schema() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples, "no example plans found"
    for path in examples:
        jsonschema.validate(yaml.safe_load(path.read_text()), plan_json_schema())


def test_schema_rejects_unknown_step_keys() -> None:
    bad = {"steps": [{"id": "a", "tool": "noop", "retires": 1}]}
    try:
        jsonschema.validate(bad, plan_json_schema())
    except jsonschema.ValidationError as exc:
        assert "retires" in str(exc)
    else:
        raise AssertionError("schema accepted an unknown key")
