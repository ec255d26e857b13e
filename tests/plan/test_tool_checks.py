"""Steps without arguments are checked against their tool once per tool, and every such step still gets its problem."""

from __future__ import annotations

import pytest

from planweave import PlanInvalid, builtin_tools, parse_plan_document, validate_plan


def problems(steps: list[dict[str, object]]) -> list[str]:
    with pytest.raises(PlanInvalid) as info:
        validate_plan(parse_plan_document({"steps": steps}), builtin_tools(), {})
    return [str(p) for p in info.value.problems]


def test_each_step_without_arguments_names_its_missing_argument() -> None:
    found = problems([{"id": "a", "tool": "sleep"}, {"id": "b", "tool": "noop"}, {"id": "c", "tool": "sleep"},
                      {"id": "d", "tool": "sleep", "args": {"seconds": 1}}])
    assert found == ["step 'a', args.seconds: required by tool 'sleep'",
                     "step 'c', args.seconds: required by tool 'sleep'"]


def test_each_step_of_an_unknown_tool_is_named() -> None:
    found = problems([{"id": "a", "tool": "slep"}, {"id": "b", "tool": "slep"}, {"id": "c", "tool": "noop"}])
    assert found == ["step 'a', tool: unknown tool 'slep' (did you mean 'sleep'?)",
                     "step 'b', tool: unknown tool 'slep' (did you mean 'sleep'?)"]
