"""The step a tool call belongs to, available to tools through :func:`current_step`."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from planweave.clock import Clock


def _ignore_usage(usage: Mapping[str, Any]) -> None:
    return None


class StepContext(NamedTuple):
    """Who is calling a tool: run, step, attempt number (1-based), the engine's clock, and where to report usage.

    Tools that call a model report each call with ``report_usage({"model", "prompt_tokens", "completion_tokens",
    "cost_usd", ...})``; the run journals it and counts it against the run's tokens and cost.
    """

    run_id: str
    step_id: str
    attempt: int
    clock: Clock
    report_usage: Callable[[Mapping[str, Any]], None] = _ignore_usage


_current: contextvars.ContextVar[StepContext] = contextvars.ContextVar("planweave_step")


def current_step() -> StepContext:
    """The context of the step whose tool call is running (raises LookupError outside a step)."""
    return _current.get()


def set_current_step(ctx: StepContext) -> contextvars.Token[StepContext]:
    return _current.set(ctx)
