"""The plan model (pure core): steps, references, validation, fingerprints and critical paths."""

from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.core.plan.model import Estimate, PlanSpec, RetryPolicy, Step, StepStatus

__all__ = [
    "Estimate",
    "Plan",
    "PlanSpec",
    "RetryPolicy",
    "Step",
    "StepStatus",
    "ToolCatalog",
    "ToolSpec",
    "parse_plan_document",
    "validate_plan",
]
