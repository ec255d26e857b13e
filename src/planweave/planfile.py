"""Reading plan files (YAML or JSON) from disk into plan specs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from planweave.errors import PlanInvalid, PlanProblem
from planweave.plan.graph import parse_plan_document
from planweave.plan.model import PlanSpec


def load_plan_file(path: str | Path) -> PlanSpec:
    """Read and parse a plan file; errors name the file (and line, for syntax errors)."""
    p = Path(path)
    source = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanInvalid([PlanProblem("", "", f"cannot read the file: {exc.strerror or exc}")], source) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise PlanInvalid([PlanProblem("", "", f"line {exc.lineno}, column {exc.colno}: {exc.msg}")], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PlanInvalid([PlanProblem("", "", f"{where}{problem}")], source) from None
    return parse_plan_document(data, source)
