"""The step a tool call belongs to, available to tools through :func:`current_step`."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

from planweave.core.clock import Clock
from planweave.core.plan.model import StepExecutor

NO_RESOURCES: Mapping[str, int] = MappingProxyType({})


class StepSink(Protocol):
    """Where a tool's reports go: the run executing the step."""

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None: ...

    def step_heartbeat(self, step_id: str) -> None: ...

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None: ...

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any: ...


@runtime_checkable
class ReservationSink(Protocol):
    """A sink that journals model calls' reservations durably (the run); others (a speculative attempt's, a Ray
    worker's) keep none, and a call through them is not journaled before it goes out."""

    async def step_reserved(self, step_id: str, reservation: Mapping[str, Any]) -> None: ...

    def step_released(self, step_id: str, release: Mapping[str, Any]) -> None: ...


@runtime_checkable
class ToolCallSink(Protocol):
    """A sink through which a step calls other tools of its run as steps of their own (the run; the ``llm`` tool's
    native tool calls): each call a child step with the tool's own limits and journal entries."""

    def step_tool(self, name: str) -> tuple[str, Mapping[str, Any]] | None:
        """The description and argument schema of the run's tool ``name``; None when the run has no such tool."""
        ...

    async def step_call(self, step_id: str, child: Mapping[str, Any]) -> Any:
        """Add ``child`` (a step document, with its own id) to the run unless it is there already, wait for it to
        end without holding ``step_id``'s concurrency slot, and return its output (StepFailed when it did not
        succeed)."""
        ...


class StepContext(NamedTuple):
    """Who is calling a tool: run, step, attempt number (1-based), the engine's clock, and where reports go.

    Long-running tools call :meth:`heartbeat` (or :meth:`progress`) regularly: a step with ``heartbeat: S`` whose
    tool stays silent for S seconds is treated as hung. Tools that call a model report each call with
    :meth:`report_usage`; the run journals it and counts it against the run's tokens and cost. All three are safe
    to call from a worker thread (sync tools) and do nothing outside a run. ``isolation`` is the step's
    ``isolation`` key (``thread``, ``process`` or None): how a sync Python tool is to run; ``executor`` and
    ``resources`` are the step's keys of those names (where its call is to run, what it claims), for executors.
    ``priority`` is the run's priority and ``slack`` the seconds the step may start late without delaying its
    plan: model calls are queued by them (:mod:`planweave.models.admission`).
    """

    run_id: str
    step_id: str
    attempt: int
    clock: Clock
    sink: StepSink | None = None
    isolation: str | None = None
    executor: StepExecutor | None = None
    resources: Mapping[str, int] = NO_RESOURCES
    priority: float = 0.0
    slack: float | None = None

    def report_usage(self, usage: Mapping[str, Any]) -> None:
        """Journal one model call (``model``, ``prompt_tokens``, ``completion_tokens``, ``cost_usd``, ...)."""
        if self.sink is not None:
            self.sink.step_usage(self.step_id, usage)

    async def report_reservation(self, reservation: Mapping[str, Any]) -> None:
        """Journal a budgeted model call's worst case (``model_reserved``: ``reservation``, a call id its
        ``model_call`` repeats, ``tokens``, ``cost_usd``) and return once it is durable: call it before the request
        goes out, so a resume after a kill counts the call (docs/budgets.md). Nothing outside a run."""
        if isinstance(self.sink, ReservationSink):
            await self.sink.step_reserved(self.step_id, reservation)

    def report_release(self, release: Mapping[str, Any]) -> None:
        """Journal that a reserved call ended having cost nothing (``model_released``: ``reservation``, ``reason``),
        so no resume counts it; safe from a worker thread, nothing outside a run."""
        if isinstance(self.sink, ReservationSink):
            self.sink.step_released(self.step_id, release)

    def heartbeat(self) -> None:
        """Say the tool is alive: restarts the step's ``heartbeat`` idle timer."""
        if self.sink is not None:
            self.sink.step_heartbeat(self.step_id)

    def progress(self, fraction: float | None = None, message: str = "") -> None:
        """Journal progress (``fraction`` in [0, 1] and/or a message); also a heartbeat."""
        if self.sink is not None:
            self.sink.step_progress(self.step_id, fraction, message)

    def tool(self, name: str) -> tuple[str, Mapping[str, Any]] | None:
        """The run's tool ``name``: its description and argument schema (None: no such tool, or no run that can call
        tools for a step)."""
        return self.sink.step_tool(name) if isinstance(self.sink, ToolCallSink) else None

    async def call(self, child: Mapping[str, Any]) -> Any:
        """Run ``child`` (a step document) as a step of this run and return its output (:class:`ToolCallSink`).

        Raises :class:`~planweave.core.errors.RunError` where the step has no run that can add steps (outside a run,
        a speculative attempt, a Ray worker)."""
        if not isinstance(self.sink, ToolCallSink):
            from planweave.core.errors import RunError

            raise RunError(f"step '{self.step_id}' has no run to call tool '{child.get('tool')}' through")
        return await self.sink.step_call(self.step_id, child)

    async def ask(self, prompt: str, schema: Mapping[str, Any] | None = None) -> Any:
        """Wait for a person to give this step a value (``waiting_input``); return it (call from the loop's thread).

        Raises :class:`~planweave.core.errors.RunError` outside a run.
        """
        if self.sink is None:
            from planweave.core.errors import RunError

            raise RunError(f"step '{self.step_id}' has no run to ask a person through")
        return await self.sink.step_input(self.step_id, prompt, schema)


current_step_var: contextvars.ContextVar[StepContext] = contextvars.ContextVar("planweave_step")


def current_step() -> StepContext:
    """The context of the step whose tool call is running (raises LookupError outside a step)."""
    return current_step_var.get()


def set_current_step(ctx: StepContext) -> contextvars.Token[StepContext]:
    return current_step_var.set(ctx)
