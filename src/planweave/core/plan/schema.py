"""The JSON Schema of plan files, generated from the plan model (the committed copy is checked by a test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planweave.core.plan.model import PlanSpec

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json"


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that plan files follow."""
    schema = PlanSpec.model_json_schema(by_alias=True)
    # `retries: 3` is shorthand for `retries: {max: 3}` (accepted by a before-validator the schema cannot see).
    count = {"type": "integer", "minimum": 0, "maximum": 1000}
    step_retries = schema["$defs"]["Step"]["properties"]["retries"]
    schema["$defs"]["Step"]["properties"]["retries"] = {
        "anyOf": [count, {"$ref": "#/$defs/RetryPolicy"}],
        "description": "Retries after the first attempt, or a retry policy.",
        "default": step_retries.get("default"),
    }
    defaults_retries = schema["$defs"]["StepDefaults"]["properties"]["retries"]
    schema["$defs"]["StepDefaults"]["properties"]["retries"] = {
        "anyOf": [count, {"$ref": "#/$defs/RetryPolicy"}, {"type": "null"}],
        "description": defaults_retries.get("description", ""),
        "default": None,
    }
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://planweave.dev/schemas/plan.schema.json"
    schema["title"] = "planweave plan"
    schema["description"] = "A plan: steps (tool calls) whose arguments may reference other steps' outputs."
    return schema


def render_schema() -> str:
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render_schema(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
