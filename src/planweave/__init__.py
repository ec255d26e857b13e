"""planweave: plan long-horizon agent tasks as versioned DAGs and run them event-driven on a durable journal."""

from planweave.api import open_engine, open_model, run_goal, start_goal
from planweave.clock import Clock, RealClock, VirtualClock, run_virtual
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
from planweave.errors import (
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
from planweave.journal import Journal, open_journal
from planweave.plan import Plan, PlanSpec, RetryPolicy, Step, parse_plan_document, validate_plan
from planweave.planfile import load_plan_file
from planweave.tools import Tool, Toolbox, builtin_tools, tool

__version__ = "0.1.0"


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
