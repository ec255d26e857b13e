"""planweave: plan long-horizon agent tasks as versioned DAGs and run them event-driven on a durable journal.

The names below load on first use (PEP 562): ``import planweave.core.plan`` or ``import planweave`` alone loads no
runtime, journal or tool; ``from planweave import Engine`` loads the runtime then.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from planweave.api import open_engine, open_model, run_goal, start_goal
    from planweave.core.clock import Clock, RealClock, VirtualClock, run_virtual
    from planweave.core.errors import (
        InputRejected,
        JournalError,
        PlanError,
        PlanInvalid,
        PlanProblem,
        PlanweaveError,
        ReplyRefused,
        RunError,
        RunNotFound,
        StepFailed,
        ToolError,
    )
    from planweave.core.plan import Plan, PlanSpec, RetryPolicy, Step, parse_plan_document, validate_plan
    from planweave.engine import (
        DEFAULT_CONCURRENCY,
        Engine,
        Event,
        Run,
        RunResult,
        StepContext,
        current_step,
        send_approval,
        send_input,
    )
    from planweave.journal import Journal, open_journal
    from planweave.planfile import load_plan_file
    from planweave.tools import Tool, Toolbox, builtin_tools, tool

__version__ = "0.1.0"

_WHERE: dict[str, str] = {
    "Clock": "planweave.core.clock",
    "DEFAULT_CONCURRENCY": "planweave.engine",
    "Engine": "planweave.engine",
    "Event": "planweave.core.events",
    "InputRejected": "planweave.core.errors",
    "Journal": "planweave.journal",
    "JournalError": "planweave.core.errors",
    "Plan": "planweave.core.plan",
    "PlanError": "planweave.core.errors",
    "PlanInvalid": "planweave.core.errors",
    "PlanProblem": "planweave.core.errors",
    "PlanSpec": "planweave.core.plan",
    "PlanweaveError": "planweave.core.errors",
    "RealClock": "planweave.core.clock",
    "ReplyRefused": "planweave.core.errors",
    "RetryPolicy": "planweave.core.plan",
    "Run": "planweave.engine",
    "RunError": "planweave.core.errors",
    "RunNotFound": "planweave.core.errors",
    "RunResult": "planweave.engine",
    "Step": "planweave.core.plan",
    "StepContext": "planweave.engine",
    "StepFailed": "planweave.core.errors",
    "Tool": "planweave.tools",
    "ToolError": "planweave.core.errors",
    "Toolbox": "planweave.tools",
    "VirtualClock": "planweave.core.clock",
    "builtin_tools": "planweave.tools",
    "current_step": "planweave.engine",
    "load_plan_file": "planweave.planfile",
    "open_engine": "planweave.api",
    "open_journal": "planweave.journal",
    "open_model": "planweave.api",
    "parse_plan_document": "planweave.core.plan",
    "run_goal": "planweave.api",
    "run_virtual": "planweave.core.clock",
    "send_approval": "planweave.engine",
    "send_input": "planweave.engine",
    "start_goal": "planweave.api",
    "tool": "planweave.tools",
    "validate_plan": "planweave.core.plan",
}


def __getattr__(name: str) -> _typing.Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'planweave' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

__all__ = [
    "DEFAULT_CONCURRENCY",
    "Clock",
    "Engine",
    "Event",
    "InputRejected",
    "Journal",
    "JournalError",
    "Plan",
    "PlanError",
    "PlanInvalid",
    "PlanProblem",
    "PlanSpec",
    "PlanweaveError",
    "RealClock",
    "ReplyRefused",
    "RetryPolicy",
    "Run",
    "RunError",
    "RunNotFound",
    "RunResult",
    "Step",
    "StepContext",
    "StepFailed",
    "Tool",
    "ToolError",
    "Toolbox",
    "VirtualClock",
    "builtin_tools",
    "current_step",
    "load_plan_file",
    "open_engine",
    "open_journal",
    "open_model",
    "parse_plan_document",
    "run_goal",
    "run_virtual",
    "send_approval",
    "send_input",
    "start_goal",
    "tool",
    "validate_plan",
]
