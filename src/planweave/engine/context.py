"""The step a tool call belongs to, available to tools through :func:`current_step`."""

from __future__ import annotations

import contextvars
from typing import NamedTuple

from planweave.clock import Clock


class StepContext(NamedTuple):
    """Who is calling a tool: run, step, attempt number (1-based) and the engine's clock."""

    run_id: str
    step_id: str
    attempt: int
    clock: Clock


_current: contextvars.ContextVar[StepContext] = contextvars.ContextVar("planweave_step")


def current_step() -> StepContext:
    """The context of the step whose tool call is running (raises LookupError outside a step)."""
    return _current.get()


def set_current_step(ctx: StepContext) -> contextvars.Token[StepContext]:
    return _current.set(ctx)
