"""The public exports of the planweave package."""

from __future__ import annotations

import planweave


def test_public_names_are_exported_and_exist() -> None:
    expected = {
        "Engine", "Run", "RunResult", "Event", "Plan", "PlanSpec", "Step", "RetryPolicy", "Tool", "Toolbox",
        "tool", "builtin_tools", "open_engine", "open_journal", "validate_plan", "parse_plan_document",
        "load_plan_file", "RealClock", "VirtualClock", "run_virtual", "current_step", "StepContext",
        "PlanweaveError", "PlanError", "PlanInvalid", "PlanProblem", "RunError", "RunNotFound", "JournalError",
        "ToolError", "StepFailed",
    }
    assert expected <= set(planweave.__all__)
    for name in planweave.__all__:
        assert hasattr(planweave, name), name


def test_errors_form_one_hierarchy() -> None:
    for name in ("PlanError", "PlanInvalid", "RunError", "RunNotFound", "JournalError", "ToolError", "StepFailed"):
        assert issubclass(getattr(planweave, name), planweave.PlanweaveError)
