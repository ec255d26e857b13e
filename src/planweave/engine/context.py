"""The step a tool call belongs to, available to tools through :func:`current_step`."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from planweave.clock import Clock


def _ignore_usage(step_id: str, usage: Mapping[str, Any]) -> None:
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
    usage_sink: Callable[[str, Mapping[str, Any]], None] = _ignore_usage

    def report_usage(self, usage: Mapping[str, Any]) -> None:
        """Journal one model call made by this step's tool (tokens and cost count against the run)."""
        self.usage_sink(self.step_id, usage)


current_step_var: contextvars.ContextVar[StepContext] = contextvars.ContextVar("planweave_step")


def current_step() -> StepContext:
    """The context of the step whose tool call is running (raises LookupError outside a step)."""
    return current_step_var.get()


def set_current_step(ctx: StepContext) -> contextvars.Token[StepContext]:
    return current_step_var.set(ctx)
