"""planweave: plan long-horizon agent tasks as versioned DAGs and run them event-driven on a durable journal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

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
from planweave.plan.catalog import ToolCatalog
from planweave.planfile import load_plan_file
from planweave.tools import Tool, Toolbox, builtin_tools, tool

__version__ = "0.1.0"


@asynccontextmanager
async def open_engine(
    journal: str | Journal | None = None,
    *,
    clock: Clock | None = None,
    concurrency: int | None = DEFAULT_CONCURRENCY,
    capacities: Mapping[str, int] | None = None,
    tools: ToolCatalog | None = None,
    redact: Callable[[Any], Any] | None = None,
    cache: bool = True,
) -> AsyncIterator[Engine]:
    """Open a journal by URL (or use the one given) and an :class:`Engine` on it; close both on exit.

    ``journal`` None means the default (``$PLANWEAVE_JOURNAL`` or ``sqlite:///.planweave/runs.db``);
    ``concurrency`` defaults to 64 steps at once, ``None`` means unlimited; ``cache=False``: no step reuses a cached
    output (docs/caching.md).
    """
    if journal is None or isinstance(journal, str):
        async with open_journal(journal) as opened, Engine(
            opened, clock=clock, concurrency=concurrency, capacities=capacities, tools=tools, redact=redact,
            cache=cache,
        ) as engine:
            yield engine
    else:
        async with Engine(journal, clock=clock, concurrency=concurrency, capacities=capacities, tools=tools,
                          redact=redact, cache=cache) as engine:
            yield engine


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
    "parse_plan_document",
    "run_virtual",
    "send_approval",
    "send_input",
    "tool",
    "validate_plan",
]
