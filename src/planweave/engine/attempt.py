"""One attempt of a step: its call, the call under timeout and heartbeat, its stored output, and what a failure means.

The :class:`~planweave.engine.runtime.Run` drives an attempt through these functions in order — :func:`prepare`,
the executor (directly, or :func:`guarded` when the step has a timeout or a heartbeat), :func:`store_output` — and
on a failure asks :func:`classify` what it was and :func:`decide` what happens next. Nothing here emits events:
the run journals what these return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, NamedTuple

from planweave.core.errors import ToolError
from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.core.plan.graph import Plan
from planweave.core.plan.model import NEVER_RETRIED, Step
from planweave.core.plan.refs import RefResolutionError, render
from planweave.core.state import StepRecord
from planweave.engine.executor import Executor, ToolCall
from planweave.journal.base import Journal, OutputNotSerialisable, canonical_output

#: Per step: the heartbeat idle timer of its running attempt and its period (what ``heartbeat()`` reschedules).
Watchdogs = MutableMapping[str, tuple[asyncio.Timeout, float]]


class Failure(NamedTuple):
    """What a failed attempt was: its kind, whether it may be retried, the message, the exception class names."""

    kind: str
    retryable: bool
    message: str
    names: tuple[str, ...]


class Retry(NamedTuple):
    """Run the step again after ``delay`` seconds."""

    delay: float


FALLBACK = "fallback"
"""Run the step's fallback tool now (its retries are spent or the failure is not retried)."""
GIVE_UP = "give_up"
"""The step failed for good."""
Decision = Retry | str


def prepare(plan: Plan, rec: StepRecord, outputs: Mapping[str, Any], tools: ToolCatalog
            ) -> tuple[ToolSpec, Mapping[str, Any]]:
    """The tool to call for this attempt (the fallback's once it is active) and its rendered arguments.

    Raises :class:`RefResolutionError` when a reference does not resolve against ``outputs``.
    """
    sid = rec.id
    if rec.fallback_active:
        fallback = plan.steps[sid].fallback
        if fallback is not None:
            return tools[fallback.tool], render(plan.fallbacks[sid], outputs)
    # Without references the compiled template is the arguments themselves (with `$${` unescaped).
    tool = tools[plan.values[sid]["tool"]]
    return tool, render(plan.templates[sid], outputs) if plan.refs[sid] else plan.templates[sid]


async def guarded(executor: Executor, call: ToolCall, step: Step, watchdogs: Watchdogs) -> Any:
    """Execute ``call`` under the step's timeout and heartbeat idle timer (both ``asyncio.timeout``).

    While it runs, ``watchdogs[step id]`` holds the idle timer, which a heartbeat reschedules. A heartbeat that
    does not come in time raises a :class:`ToolError` of kind ``timeout`` naming it; the overall timeout raises
    ``TimeoutError``. An executor whose ``reports_start(call)`` is true (a remote task, queued before it runs) beats
    once when the call starts: the idle timer is armed then, not on submission.
    """
    async with asyncio.timeout(step.timeout) as overall:
        if step.heartbeat is None:
            return await executor.execute(call)
        reports_start = getattr(executor, "reports_start", None)
        idle = asyncio.timeout(None if reports_start is not None and reports_start(call) else step.heartbeat)
        sid = call.step_id
        try:
            async with idle:
                watchdogs[sid] = (idle, step.heartbeat)
                return await executor.execute(call)
        except TimeoutError:
            if idle.expired() and not overall.expired():
                raise ToolError(f"no heartbeat for {step.heartbeat:g}s: the tool is treated as hung",
                                kind="timeout") from None
            raise
        finally:
            watchdogs.pop(sid, None)


def beat(watchdogs: Watchdogs, step_id: str, now: float) -> None:
    """A heartbeat of step ``step_id`` at loop time ``now``: restart its idle timer if it has one."""
    watch = watchdogs.get(step_id)
    if watch is not None and not watch[0].expired():
        watch[0].reschedule(now + watch[1])


def store_output(output: Any, step_id: str, journal: Journal, *, limit: int | None,
                 redact: Callable[[Any], Any] | None) -> tuple[Any, str]:
    """The output's canonical form (the only form, live and on replay) and the journal's reference to its blob.

    Raises :class:`OutputNotSerialisable` when the output is no JSON value or exceeds ``limit`` bytes. ``redact``
    rewrites what is stored, never what later steps see.
    """
    blob = canonical_output(output, step=step_id, limit=limit)
    return blob.value, journal.put_blob(blob if redact is None else redact(blob.value))  # not encoded again


def classify(exc: BaseException, step: Step) -> Failure:
    """What a failed attempt was.

    A tool raising ``SystemExit`` (kind ``exit``) or ``KeyboardInterrupt`` (kind ``interrupted``) asked to stop:
    its step fails, the process goes on, and only a retry policy naming the kind retries it.
    """
    names = tuple(c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException, Exception))
    if isinstance(exc, SystemExit):
        return Failure("exit", True, f"the tool raised SystemExit({exc.code!r})", names)
    if isinstance(exc, KeyboardInterrupt):
        return Failure("interrupted", True, "the tool raised KeyboardInterrupt", names)
    if isinstance(exc, TimeoutError):
        limit = f" after {step.timeout:g}s" if step.timeout else ""
        return Failure("timeout", True, f"timed out{limit}", names)
    if isinstance(exc, ToolError):
        return Failure(exc.kind, exc.retryable and exc.kind not in NEVER_RETRIED, str(exc), names)
    if isinstance(exc, OutputNotSerialisable):
        return Failure("output", False, str(exc), names)
    if isinstance(exc, RefResolutionError):
        return Failure("reference", False, str(exc), names)
    text = str(exc)
    return Failure(type(exc).__name__, True, f"{type(exc).__name__}: {text}" if text else type(exc).__name__, names)


def decide(failure: Failure, step: Step, attempt: int, *, fallback_active: bool, jitter: float) -> Decision:
    """What follows a failed attempt: a :class:`Retry` within the step's policy, else its fallback, else give up.

    ``jitter`` in [0, 1) spreads the retry delay (the run draws it deterministically per step and attempt).
    """
    policy = step.retries
    if failure.retryable and attempt <= policy.max and policy.retries_on(failure.kind, failure.names):
        return Retry(policy.delay(attempt, jitter))
    return settle(step, fallback_active=fallback_active)


def settle(step: Step, *, fallback_active: bool) -> str:
    """A step failing with no retry left (or rejected, or timed out waiting): its fallback if unused, else give up."""
    return FALLBACK if step.fallback is not None and not fallback_active else GIVE_UP
