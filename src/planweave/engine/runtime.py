"""The engine: runs plans event-driven on an asyncio loop, journaling every state change.

A step is launched from the event that made it ready (its last dependency's success), never by a polling loop.
Every run owns a TaskGroup (its timers and speculative attempts) and keeps its step attempts' tasks itself, with the
same guarantee: cancelling the run cancels its steps, and it ends only once every attempt has. The engine owns the
runs' TaskGroup and one :class:`~planweave.core.scheduler.Scheduler`, so runs share capacities.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from planweave.core.clock import Clock, RealClock
from planweave.core.context import StepContext
from planweave.core.errors import (
    EventNotRecorded,
    InputRejected,
    JournalError,
    RunError,
    RunNotFound,
    did_you_mean,
)
from planweave.core.events import Event, EventKind
from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.core.plan.graph import Plan, parse_plan_document, parse_step, validate_plan
from planweave.core.plan.model import TERMINAL_STATUSES, Claim, PlanSpec, SpeculationMode, SpeculationSpec, Step
from planweave.core.plan.refs import render_text
from planweave.core.replies import GIVEN_KINDS, refusal, reply_events, standing_reply
from planweave.core.scheduler import Scheduler
from planweave.core.speculation import Predictor
from planweave.core.splice import SpliceDiff, StaleProposal, merge_proposal, splice_diff
from planweave.core.state import ACTIVE, OnFailure, RunState, RunStatus, StepRecord
from planweave.engine import attempt as _attempt
from planweave.engine.attempt import FALLBACK, Retry, Watchdogs
from planweave.engine.cache import CacheEntry, StepCache
from planweave.engine.collector import DEFAULT_FREEZE_EVERY, CollectorPolicy
from planweave.engine.dispatch import Dispatcher
from planweave.engine.executor import Executor, InProcessExecutor, ToolCall
from planweave.engine.loopwatch import LoopWatch
from planweave.engine.protocols import Closable, PlanSeal
from planweave.engine.speculative import Speculator, resolve_policy
from planweave.journal.base import Journal, NullJournal, ReplyWritten, append_reply, scrub

if TYPE_CHECKING:
    from planweave.engine.limits import LimitsRecord

EventListener = Callable[[Event], None]
_PLAN_KINDS = frozenset({"run_created", "plan_version", "steps_added"})


def _sealing(append: Callable[[Event], None], seal: PlanSeal) -> Callable[[Event], None]:
    """``append``, sealing the plans of the events that carry one first (the run itself keeps the values)."""

    def append_sealed(event: Event) -> None:
        append(seal.seal(event) if event[1] in _PLAN_KINDS else event)

    return append_sealed
_new_tuple = tuple.__new__  # a NamedTuple of every field, without the Python-level call of its __new__
_new_event = _new_tuple
_STARTED = {n: {"attempt": n} for n in (1, 2, 3)}
# Events whose data must be journaled exactly as given (plans, a person's input): refused, never scrubbed.
_EXACT_KINDS = frozenset({"run_created", "steps_added", "plan_version", "input_given"})
#: The default bound on a step's encoded output (``Engine(max_output_bytes=...)``).
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
DEFAULT_CONCURRENCY = 64
"""Most steps an engine runs at once when its caller says nothing (``concurrency=None`` means unlimited)."""


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


@dataclass(frozen=True)
class RunResult:
    """How a run ended: status, the error naming the root cause, per-step outputs and the ``--json`` summary."""

    run_id: str
    status: RunStatus
    error: str | None
    outputs: Mapping[str, Any]
    state: RunState = field(repr=False)

    @property
    def ok(self) -> bool:
        """Whether the run succeeded."""
        return self.status == "succeeded"

    @property
    def answer(self) -> str | None:
        """A goal run's final answer (the joiner's), or None: a plan run, or a goal run that did not succeed (its
        joiner's text, if any, is ``summary["partial_answer"]``)."""
        return self.state.answer if self.ok else None

    @cached_property
    def summary(self) -> Mapping[str, Any]:
        """The ``planweave run --json`` object (built on first use: large runs need not pay for it)."""
        return self.state.summary()


@dataclass(frozen=True, slots=True)
class RunHost:
    """What a :class:`Run` needs of its engine, and nothing more (the engine builds one and hands it to each run).

    ``dispatch`` queues and admits its steps within the engine-wide limits; ``executor`` performs their tool calls;
    ``listeners`` are the engine's (a run copies them when it starts); ``start_task`` starts the run's own task in
    the engine's task group and ``forget`` drops a run that ended from the engine's active runs.
    """

    clock: Clock
    journal: Journal
    executor: Executor
    dispatch: Dispatcher
    redact: Callable[[Any], Any] | None
    seal: PlanSeal | None
    max_output_bytes: int | None
    listeners: Sequence[EventListener]
    start_task: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
    forget: Callable[[str], None]
    cache: bool = True  # reuse cached outputs of cacheable steps (docs/caching.md); outputs are indexed either way


class Run:
    """One execution of a plan inside an :class:`Engine`. Await :meth:`wait` for its result."""

    def __init__(self, host: RunHost, run_id: str, tools: ToolCatalog, state: RunState, *, holds: int = 0,
                 speculation: SpeculationSpec | None = None, predictor: Predictor | None = None) -> None:
        """A run of ``state``'s plan with ``tools``; ``holds`` keeps it open until as many :meth:`release` calls;
        ``speculation`` (not ``off``) starts steps on predicted inputs (docs/speculation.md)."""
        self.id = run_id
        self.state = state
        self.outputs: dict[str, Any] = {}
        self.priority = 0.0  # the run's priority for shared resources (model calls queue by it): higher first
        self._host = host
        self._journal = host.journal
        self._clock = host.clock
        self._executor = host.executor
        self._tools = tools
        dispatch = host.dispatch
        self._dispatch = dispatch
        self._enqueue, self._give_back, self._pump = dispatch.enqueue, dispatch.release, dispatch.pump
        self._tg: asyncio.TaskGroup | None = None
        self._done = asyncio.Event()
        self._result: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        self._listeners: list[EventListener] = list(host.listeners)
        self._durable = self._journal.durable
        self._tasks: dict[str, asyncio.Task[None]] = {}  # per step: its attempt's task (see launch)
        self._cancelled: set[asyncio.Task[None]] = set()  # attempts cancelled, not ended yet: the run waits for them
        self._closing = False  # the run is ending: no attempt starts any more
        self._holds = holds
        self._now = self._clock.now
        self._append: Callable[[Event], None] | None = (
            self._journal.append if host.seal is None else _sealing(self._journal.append, host.seal))
        if host.seal is None and isinstance(self._journal, NullJournal):
            self._append = None  # a journal that keeps nothing: no call per event
        self._journal.track(run_id, state, host.redact)  # the run's summary: from this state, once per batch
        self._watchdogs: Watchdogs = {}
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._ready = asyncio.Event()
        self._refused: EventNotRecorded | None = None  # the first event, refused by the journal
        self._journal_lost: JournalError | None = None  # a write the journal lost (e.g. a full disk): run stopped
        self._inputs: dict[str, asyncio.Future[Any]] = {}  # human.input calls waiting for a value
        self._answers: dict[str, Event] = {}  # step -> the reply this run applied to its last wait (it stands)
        self._replies_taken: set[int] = set()  # positions of the journaled replies already applied or refused
        self._timers: dict[str, asyncio.Task[None]] = {}  # per step: a retry delay or the deadline of an approval
        self._spec: Speculator | None = None  # speculative attempts (None: speculation off, nothing to pay)
        if speculation is not None and speculation.mode != "off":
            self._spec = Speculator(self, speculation, host.dispatch, tools, host.clock, host.max_output_bytes,
                                    predictor, journal=host.journal)
            self._give_back = self._release_and_speculate
        self._cache = StepCache(self._journal, self._now, lookup=host.cache, redact=host.redact)
        self._caching = StepCache.declared_in(tools)  # else only a step saying cache: may be cached

    # -- public ------------------------------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        """The current plan version."""
        return self.state.plan

    @property
    def finished(self) -> bool:
        return self._result.done()

    @property
    def dispatcher(self) -> Dispatcher:
        """The engine's dispatcher: speculative work that is not a step of the plan yet (a draft planner's attempts,
        planning/draft.py) holds its spare slots (:meth:`Dispatcher.take_spare`)."""
        return self._dispatch

    async def wait(self) -> RunResult:
        """Wait for the run to end; raise RunError if it was interrupted (the engine closed) instead."""
        return await asyncio.shield(self._result)

    def cancel(self, reason: str = "cancelled by user") -> None:
        """Stop the run: every in-flight step is cancelled promptly and the journal records it."""
        if self.finished or self._cancel_reason is not None or self._task is None:
            return
        self._cancel_reason = reason
        self._emit("run_cancelled", None, {"reason": reason})
        self._dispatch.withdraw(self)
        self._task.cancel()

    def fail(self, reason: str) -> None:
        """End the run ``failed`` with error ``reason`` now: a decision (a person aborted, no model to plan with).

        Like :meth:`cancel`, every in-flight step is cancelled promptly and nothing new starts (journaled as
        ``run_cancelled`` with ``status: failed``). Unlike ``on_failure: stop``, the decision is final: the
        cancelled steps are not resumable and :meth:`Engine.resume` refuses the run.
        """
        if self.finished or self._cancel_reason is not None or self._task is None:
            return
        self._cancel_reason = reason
        self._emit("run_cancelled", None, {"reason": reason, "status": "failed"})
        self._dispatch.withdraw(self)
        self._task.cancel()

    def cancel_step(self, sid: str, reason: str) -> bool:
        """Cancel step ``sid`` alone, for good (deadline pressure dropping an optional step): journaled as
        ``step_cancelled`` with ``reason``, its attempt stopped, its pending dependents skipped; the run goes on.
        Returns False when the step had finished already (nothing to cancel); raises RunError for an unknown step."""
        self._check_alive()
        rec = self.state.records.get(sid)
        if rec is None:
            raise RunError(f"run '{self.id}' has no step '{sid}'")
        if rec.status in TERMINAL_STATUSES:
            return False
        timer = self._timers.pop(sid, None)  # a retry's delay or an approval's deadline
        task = self._tasks.pop(sid, None)
        self._emit("step_cancelled", sid, {"reason": reason})
        if timer is not None:
            timer.cancel()
        if task is not None:
            self._cancel_attempt(task)
        self._check_done()
        return True

    def subscribe(self, listener: EventListener) -> None:
        """Call ``listener`` with every event this run emits from now on."""
        self._listeners.append(listener)

    async def events(self, after: int = 0) -> AsyncIterator[Event]:
        """The run's journaled events past position ``after`` (0: from its start), in order, then each new one as it
        is journaled; the iteration ends after the run's last event (or when the engine closes under it).

        Read from the run's journal (events written by another process, a person's reply, included), with a
        listener as the signal that more are there: a burst of events is one read. Each event carries its ``pos``,
        so a consumer that stops can go on from where it was. A journal that keeps nothing (``null://``) has no
        event to give: the iteration ends with the run.
        """
        more = asyncio.Event()

        def woken(_event: Event) -> None:
            more.set()

        self._listeners.append(woken)
        try:
            while True:
                more.clear()
                ended = self.finished  # before the read: a run that ended had journaled its last event by then
                for event in await self._journal.read(self.id, after=after):
                    after = event.pos if event.pos is not None else after
                    yield event
                if ended:
                    return
                waiting = asyncio.ensure_future(more.wait())
                await asyncio.wait((waiting, self._result), return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
        finally:
            self._listeners.remove(woken)

    # -- event emission: the only place state changes -------------------------------------------------------------
    def _emit_step(self, kind: Literal["step_started", "step_succeeded"], sid: str, data: Mapping[str, Any]) -> None:
        """An attempt's start or success, through :meth:`_emit`; but when nothing can see the event (a journal that
        keeps nothing, no listener), folded without building it: the same fold, a tuple and two calls less (~6 % of
        a no-op step's instructions on null://: docs/benchmarks.md, "the event nobody sees")."""
        if self._append is not None or self._listeners:
            self._emit(kind, sid, data)
            return
        state = self.state
        state.events_applied += 1
        now = self._now()
        if kind == "step_started":
            state.step_started(sid, now, data)  # type: ignore[arg-type]
        elif ready := state.step_succeeded(sid, now, data):  # type: ignore[arg-type]
            self._enqueue_ready(ready, now)

    def _emit(self, kind: EventKind, step: str | None, data: Mapping[str, Any]) -> None:
        # Hot path (several calls per step): the tuple is built directly rather than through Event's __new__.
        event: Event = _new_event(Event, (self.id, kind, self._now(), step, data, None))
        append = self._append
        if append is not None:
            try:
                append(event)  # before the fold: an event the journal refuses changes nothing
            except EventNotRecorded:
                if kind in _EXACT_KINDS:
                    raise
                # Text the engine passes on (tool errors, progress, model replies) may hold lone surrogates: record
                # it with U+FFFD in their place rather than lose the event.
                event = _new_event(Event, (self.id, kind, event[2], step, scrub(data), None))
                append(event)
        ready = self.state.apply(event)
        if self._listeners:
            for listener in self._listeners:
                listener(event)
        if ready:
            self._enqueue_ready(ready, event[2])

    def _enqueue_ready(self, ready: Sequence[str], now: float) -> None:
        """Steps an event made ready at ``now``: each waits for approval, is its speculative attempt, or is queued."""
        enqueue = self._enqueue
        approvals = self.state.approvals
        spec = self._spec
        left = len(ready)
        for sid in ready:
            if approvals and sid in approvals and self.state.needs_approval(sid):
                self._request_approval(sid)
            elif spec is not None and sid in spec.attempts and spec.resolve(self.state.records[sid]):
                pass  # its speculative attempt, on the real arguments, is its attempt
            else:
                enqueue(self, sid, now, left)
            left -= 1

    # -- lifecycle ----------------------------------------------------------------------------------------------
    # -- what the engine drives ---------------------------------------------------------------------------------
    async def begin(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        """Start the run's task with its first event (``run_created`` or ``run_resumed``; the engine calls this).

        Raises EventNotRecorded (the run never existed) if the journal refuses that event.
        """
        self._task = self._host.start_task(self._main(kind, data), f"planweave-run-{self.id}")
        await self._ready.wait()  # the run's TaskGroup exists: its plan can change and it can be cancelled
        if self._refused is not None:
            await asyncio.wait([self._task])
            raise self._refused

    async def _main(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        crashed: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                failure: BaseException | None = None
                try:
                    await self._drive(kind, data)
                except BaseException as exc:
                    self._stop_attempts()  # as the TaskGroup does with its own tasks when it exits this way
                    failure = exc
                # Not in a `finally`: mypyc (setup.py) miscompiles an await there (a stale CancelledError came out).
                await self._join_attempts()
                if failure is not None:
                    raise failure
        except asyncio.CancelledError:
            if self._cancel_reason is None:  # the engine is closing: leave the run resumable, record nothing
                if not self._result.done():
                    self._result.set_exception(RunError(self._interrupted()))
                    self._result.exception()  # mark retrieved: nobody may be waiting
                if self._journal_lost is not None:
                    self._host.forget(self.id)
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception as exc:  # an engine bug must end the run visibly, not hang it
            crashed = exc
        finally:
            self._tg = None
        if self._refused is not None:
            return  # nothing was journaled or applied: begin reports it, and there is no run_finished
        status: RunStatus
        error: str | None
        if crashed is not None:
            status, error = "failed", f"internal error: {type(crashed).__name__}: {crashed}"
        else:
            status, error = self.state.outcome()
        self._emit("run_finished", None, {"status": status, "error": error})
        try:
            await self._journal.flush()
        except JournalError as exc:
            error = f"{error}; and the journal could not be written: {exc}" if error else str(exc)
        self._host.forget(self.id)
        self._result.set_result(
            RunResult(self.id, status, error, self.outputs, self.state)
        )

    async def _drive(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        """The run inside its TaskGroup: its first event, then until no step is active (or it is stopped)."""
        try:
            self._emit(kind, None, data)
        except EventNotRecorded as exc:
            self._refused = exc
            return
        finally:
            self._ready.set()
        if kind != "run_created":  # a new run has nobody to wait for yet
            self._rewait()
        self._pump()
        if self._spec is not None:
            self._spec.schedule()
        self._check_done()
        await self._done.wait()
        if self._spec is not None:
            self._spec.close()
        for timer in self._timers.values():
            timer.cancel()

    def _stop_attempts(self) -> None:
        """The run is ending early (cancelled, interrupted, crashed): start no attempt, cancel those in flight."""
        self._closing = True
        for task in (*self._tasks.values(), *self._cancelled):
            task.cancel()

    async def _join_attempts(self) -> None:
        """Wait until every attempt task of the run has ended; then no attempt starts any more.

        The run keeps its attempts' tasks itself rather than in its TaskGroup: the group's done-callback is a
        second loop callback per step (-8.6 % of a no-op step's instructions, layered DAG; docs/benchmarks.md,
        "The engine at the floor"). As in a TaskGroup, a
        cancellation of the run while it waits cancels the attempts and is raised once they have ended.
        """
        cancelled: asyncio.CancelledError | None = None
        while live := [task for task in (*self._tasks.values(), *self._cancelled) if not task.done()]:
            try:
                await asyncio.wait(live)
            except asyncio.CancelledError as exc:
                cancelled = exc
                self._stop_attempts()
        self._closing = True
        if cancelled is not None:
            raise cancelled

    def _cancel_attempt(self, task: asyncio.Task[None]) -> None:
        """Cancel an attempt the run goes on without (its step was cancelled or spliced out); the run still waits
        for its task to end."""
        task.cancel()
        if not task.done():
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)

    def _crash(self, exc: BaseException) -> None:
        """An attempt's task raised (an engine bug): hand the error to the run's TaskGroup, which ends the run with
        it as it would for one of its own tasks (``internal error``, or the process's SystemExit)."""

        async def reraise() -> None:
            raise exc

        try:
            assert self._tg is not None
            self._tg.create_task(reraise())
        except (AssertionError, RuntimeError):  # the group is shutting down already: report it at least
            self._loop.call_exception_handler({"message": f"an attempt of run '{self.id}' failed", "exception": exc})

    def interrupt(self) -> None:
        """Stop the run without deciding its outcome (the engine is closing): the journal keeps it resumable."""
        if self._task is not None:
            self._task.cancel()

    def step_of(self, task: asyncio.Task[Any] | None) -> str | None:
        """The step whose attempt ``task`` is, if it is one of this run's."""
        for sid, attempt in list(self._tasks.items()):
            if attempt is task:
                return sid
        return None

    def warn_blocked(self, sid: str, data: Mapping[str, Any], since: float) -> None:
        """Journal, once the loop turns again, that step ``sid``'s tool blocked it since ``since`` (any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(_journal_warning, self, sid, data, since)

    def launch(self, rec: StepRecord, claims: Claim | None) -> None:
        """Start an attempt of step ``rec``, admitted with ``claims`` (the dispatcher calls this)."""
        sid = rec.id
        if self._tg is None or self.state.records.get(sid) is not rec or rec.status != "ready":
            self._give_back(claims)  # stale queue entry: cancelled, replaced by a new version, or a duplicate
            return
        if self._closing:
            # The run is being cancelled or interrupted and an admission arrived meanwhile: the step stays ready
            # (a resume runs it).
            self._give_back(claims)
            return
        attempt = rec.attempts + 1
        # Not in the run's TaskGroup: the run waits for its attempts itself (_join_attempts). Named by its step:
        # an unnamed task formats "Task-N" for itself, ~1.5 % of a no-op step, and a step's id says more in a
        # debugger or a stack dump. Built as loop.create_task builds it when no task factory is set, without its
        # Python frame (~2 %; docs/benchmarks.md, "the fields of a step").
        loop = self._loop
        coro = self._execute(rec, attempt, claims)
        task = (asyncio.Task(coro, loop=loop, name=sid) if loop.get_task_factory() is None
                else loop.create_task(coro, name=sid))
        # Emitted before the task first runs, so no second launch can see it ready. Event data is never mutated:
        # shared dicts are safe.
        self._emit_step("step_started", sid, _STARTED[attempt] if attempt < 4 else {"attempt": attempt})
        self._tasks[sid] = task

    async def _execute(  # noqa: C901 (each outcome of an attempt commented; the outer guard is the TaskGroup's)
        self, rec: StepRecord, attempt: int, claims: Claim | None
    ) -> None:
        """One attempt of a step (:mod:`planweave.engine.attempt`), from its write-ahead record to its outcome."""
        plan = self.state.plan
        sid = rec.id
        fields = plan.values[sid]  # the step's fields without pydantic's attribute hook (Plan.values)
        try:
            try:
                if self._durable and sid not in self.state.idempotent:
                    # Write-ahead: a non-idempotent step's start is durable before it can have effects.
                    await self._journal.flush()
                tool, args = _attempt.prepare(plan, rec, self.outputs, self._tools)
                cached = self._cache.entry(plan, rec, tool, args) if self._caching or fields["cache"] else None
                if cached is not None and (hit := await self._cache.lookup(cached)) is not None:
                    if rec.status != "cancelled":  # a hit: the tool is not called (docs/caching.md)
                        self.outputs[sid] = hit.value
                        self._emit("step_succeeded", sid, {"attempt": attempt, "output": hit.ref, "cache": hit.source})
                    return
                # Built as tuples directly, not through the NamedTuples' Python __new__ (as _emit builds events).
                context = _new_tuple(StepContext, (self.id, sid, attempt, self._clock, self, fields["isolation"],
                                                   fields["executor"], fields["resources"], self.priority,
                                                   plan.slack[sid]))
                call: ToolCall = _new_tuple(ToolCall, (tool, args, context))
                if fields["timeout"] is None and fields["heartbeat"] is None:
                    output = await self._executor.execute(call)
                else:
                    output = await _attempt.guarded(self._executor, call, plan.steps[sid], self._watchdogs)
                host = self._host
                output, ref = _attempt.store_output(output, sid, self._journal, limit=host.max_output_bytes,
                                                    redact=host.redact)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the run is cancelled, the step was spliced out, or the engine is closing
                self._fail(rec, plan.steps[sid], attempt, RuntimeError(f"tool raised CancelledError: {exc}"))
            except JournalError as exc:
                if isinstance(exc, EventNotRecorded):
                    self._fail(rec, plan.steps[sid], attempt, exc)
                else:
                    self._stop_unrecordable(exc)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                # SystemExit and KeyboardInterrupt too: raised in a task they would escape the loop and end the
                # process. A real Ctrl-C never arrives here: the CLI turns SIGINT into a cancellation of its main task.
                if rec.status == "cancelled":
                    return  # the run was stopped, and the step with it, a turn before its task saw the cancellation
                self._fail(rec, plan.steps[sid], attempt, exc)
            else:
                if rec.status == "cancelled":
                    return  # as above: the outcome came too late, the step is over
                self.outputs[sid] = output
                self._emit_step("step_succeeded", sid, {"attempt": attempt, "output": ref}
                                if cached is None and self._spec is None  # the common case of _succeeded, inline
                                else self._succeeded(sid, tool, args, cached, attempt, ref, output))
            finally:
                # The step's entry is this attempt's unless a later attempt (a fallback launched above) or a
                # replacement step (a new plan version: a new record) took it. Not `is asyncio.current_task()`, a
                # Python function in 3.11: with the executor below, ~1% of a no-op step's instructions
                # (docs/benchmarks.md, "Where planweave's time goes").
                if rec.attempts == attempt and self.state.records.get(sid) is rec:
                    self._tasks.pop(sid, None)
                self._give_back(claims)
                if not self.state.active and not self._holds:
                    self._done.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the run's own bookkeeping above failed (an engine bug): the run ends with it
            self._crash(exc)

    # -- speculative attempts (engine/speculative.py drives them through these) ---------------------------------
    def _release_and_speculate(self, claims: Claim | None) -> None:
        """The dispatcher's release, then a look for speculative work (a slot is free, an output may be new)."""
        self._dispatch.release(claims)
        if self._spec is not None:
            self._spec.schedule()

    def emit_speculation(self, kind: EventKind, sid: str, data: Mapping[str, Any]) -> None:
        """Journal a ``speculation_started``, ``_adopted`` or ``_discarded`` event of step ``sid``."""
        self._emit(kind, sid, data)

    def spawn(self, coro: Coroutine[Any, Any, None], sid: str) -> asyncio.Task[None] | None:
        """Start a speculative attempt of step ``sid`` in the run's TaskGroup (None when the run is ending)."""
        if self._tg is None:
            coro.close()
            return None
        try:
            return self._tg.create_task(coro, name=f"planweave-speculative-{self.id}-{sid}")
        except RuntimeError:
            coro.close()
            return None

    async def call_tool(self, call: ToolCall) -> Any:
        """Execute a speculative attempt's call as a step's (under its timeout and heartbeat)."""
        step = self.state.plan.steps[call.step_id]
        if step.timeout is None and step.heartbeat is None:
            return await self._executor.execute(call)
        return await _attempt.guarded(self._executor, call, step, self._watchdogs)

    def _succeeded(self, sid: str, tool: ToolSpec, args: Mapping[str, Any], cached: CacheEntry | None,
                   attempt: int, ref: str, output: Any) -> dict[str, Any]:
        """The ``step_succeeded`` data of an attempt that ran: with its cache key when it is cacheable, or (a
        speculating run) when it is an idempotent producer (a history prediction for later runs)."""
        if cached is None and self._spec is not None:
            cached = self._history_entry(sid, tool, args)
        if cached is None:
            return {"attempt": attempt, "output": ref}
        return self._cache.succeeded(cached, attempt, ref, output)

    def _history_entry(self, sid: str, tool: ToolSpec, args: Mapping[str, Any]) -> CacheEntry | None:
        """A speculating run indexes the output of an idempotent step a safe consumer references, cacheable or not:
        a later run of the journal may predict from it (docs/speculation.md, "History")."""
        spec = self._spec
        if spec is None or sid not in self.state.idempotent or not spec.predicts_for(sid):
            return None
        return self._cache.history_entry(tool, args)

    def _adopted_entry(self, rec: StepRecord, step: Step, args: Mapping[str, Any]) -> CacheEntry | None:
        """An adopted speculative attempt's output is indexed as the step's own attempt's would be."""
        tool = self._tools.get(step.tool)
        if tool is None:
            return None
        cached = self._cache.entry(self.state.plan, rec, tool, args) if self._caching or step.cache else None
        return cached if cached is not None else self._history_entry(rec.id, tool, args)

    def adopt_finished(self, rec: StepRecord, started_at: float, output: Any,
                       args: Mapping[str, Any] | None = None, *, finished_at: float | None = None) -> None:
        """Ready step ``rec`` takes the output of its finished speculative attempt (started at ``started_at``, on
        ``args``, the real arguments; ended at ``finished_at``)."""
        attempt = rec.attempts + 1
        self._emit("step_started", rec.id, {"attempt": attempt})
        self._emit("speculation_adopted", rec.id, {"started_at": started_at,
                                                   **({} if finished_at is None else {"finished_at": finished_at})})
        self.settle_adopted(rec, attempt, None, output, None, slot=False, args=args)

    def adopt_running(self, rec: StepRecord, started_at: float, task: asyncio.Task[None]) -> int:
        """Ready step ``rec``'s running speculative attempt ``task`` becomes its attempt; return the number."""
        attempt = rec.attempts + 1
        self._emit("step_started", rec.id, {"attempt": attempt})
        self._emit("speculation_adopted", rec.id, {"started_at": started_at})
        self._tasks[rec.id] = task
        return attempt

    def settle_adopted(self, rec: StepRecord, attempt: int, claims: Claim | None, output: Any,
                       error: BaseException | None, *, slot: bool = True,
                       args: Mapping[str, Any] | None = None) -> None:
        """An adopted attempt ended with ``output`` or ``error``: journal it as :meth:`_execute` does an attempt's
        outcome, and give back its slot (``slot``: it held one of the dispatcher's)."""
        sid = rec.id
        step = self.state.plan.steps[sid]
        try:
            if error is not None:
                raise error
            output, ref = _attempt.store_output(output, sid, self._journal, limit=self._host.max_output_bytes,
                                                redact=self._host.redact)
        except JournalError as exc:
            if isinstance(exc, EventNotRecorded):
                self._fail(rec, step, attempt, exc)
            else:
                self._stop_unrecordable(exc)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            if rec.status != "cancelled":
                self._fail(rec, step, attempt, exc)
        else:
            if rec.status != "cancelled":
                self.outputs[sid] = output
                cached = None if args is None else self._adopted_entry(rec, step, args)
                self._emit("step_succeeded", sid, {"attempt": attempt, "output": ref} if cached is None
                           else self._cache.succeeded(cached, attempt, ref, output))
        finally:
            if rec.attempts == attempt and self.state.records.get(sid) is rec:
                self._tasks.pop(sid, None)
            if slot:
                self._give_back(claims)
            elif self._spec is not None:
                self._spec.schedule()
            if not self.state.active and not self._holds:
                self._done.set()

    def _stop_unrecordable(self, exc: JournalError) -> None:
        """The journal lost a write (a full disk, a lost connection): stop the run, resumable from what it holds.

        Not a failure of the step whose write-ahead record failed: nothing more of the run can be recorded, and a
        new process can continue it once the journal can be written again.
        """
        if self._journal_lost is None:
            self._journal_lost = exc
        if self._task is not None:
            self._task.cancel()

    def _interrupted(self) -> str:
        if self._journal_lost is not None:
            return (f"run '{self.id}' was interrupted: {self._journal_lost}; resume it once the journal can be "
                    "written again")
        return f"run '{self.id}' was interrupted; resume it to continue"

    def _check_done(self) -> None:
        if not self.state.active and not self._holds:
            self._done.set()

    def _fail(self, rec: StepRecord, step: Step, attempt: int, exc: BaseException) -> None:
        """Journal a failed attempt and carry out what :func:`~planweave.engine.attempt.decide` says follows."""
        sid = rec.id
        failure = _attempt.classify(exc, step)
        message = failure.message if self._host.redact is None else self._host.redact(failure.message)
        jitter = random.Random(f"{self.id}/{sid}/{attempt}").random()
        decision = _attempt.decide(failure, step, attempt, fallback_active=rec.fallback_active, jitter=jitter)
        if isinstance(decision, Retry):
            self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": failure.kind,
                                            "final": False, "retry_in": decision.delay})
            assert self._tg is not None
            self._timers[sid] = self._tg.create_task(self._retry_after(rec, decision.delay))
        else:
            self._give_up(rec, step, attempt, failure.kind, message)

    def _give_up(self, rec: StepRecord, step: Step, attempt: int, kind: str, message: str) -> None:
        """The step failed without a retry left: run its fallback if it has one, else fail it for good."""
        sid = rec.id
        if _attempt.settle(step, fallback_active=rec.fallback_active) == FALLBACK and step.fallback is not None:
            self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": kind, "final": False,
                                            "retry_in": 0.0, "fallback": True})
            self._emit("escalation", sid, {"rung": "fallback", "reason": message, "tool": step.fallback.tool})
            self._enqueue(self, sid, self._clock.now())
            return
        self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": kind, "final": True})
        if self.state.on_failure == "stop":
            self._stop(sid)

    def _stop(self, root: str) -> None:
        """The run's outcome is decided (``on_failure: stop``): cancel what is in flight, start nothing new.

        The cancellations are journaled as ``resumable``, so a later resume runs those steps again.
        """
        reason = f"the run stopped: step '{root}' failed and nothing can repair it"
        self._dispatch.withdraw(self)
        for rec in list(self.state.records.values()):
            if rec.status in ACTIVE:
                self._emit("step_cancelled", rec.id, {"reason": reason, "resumable": True})
                task = self._tasks.pop(rec.id, None)
                if task is not None:
                    self._cancel_attempt(task)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # -- what tools report (StepSink; callable from worker threads) ---------------------------------------------
    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self._in_loop(self._emit, "model_call", step_id, dict(usage))

    async def step_reserved(self, step_id: str, reservation: Mapping[str, Any]) -> None:
        """Journal a step's model call's reservation and wait until it is durable (ReservationSink; a tool on a
        worker thread's loop waits for the run's loop to write it)."""
        if threading.get_ident() == self._loop_thread:
            await self.record_reservation(reservation, step_id)
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self.record_reservation(reservation, step_id), self._loop))

    def step_released(self, step_id: str, release: Mapping[str, Any]) -> None:
        self._in_loop(self._emit, "model_released", step_id, dict(release))

    async def record_reservation(self, reservation: Mapping[str, Any], step: str | None = None) -> None:
        """Journal a ``model_reserved`` event (a budgeted call's id and worst case) and return once the journal holds
        it durably: a call journals this before its request goes out, so a process killed during the call leaves a
        reservation a resume counts as spent (docs/budgets.md, "Across crashes")."""
        self._emit("model_reserved", step, reservation)
        if self._durable:
            await self._journal.flush()

    def step_heartbeat(self, step_id: str) -> None:
        self._in_loop(self._beat, step_id)

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self._in_loop(self._progress, step_id, fraction, message)

    def _beat(self, step_id: str) -> None:
        _attempt.beat(self._watchdogs, step_id, self._loop.time())

    def _progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self._beat(step_id)
        if self.state.records.get(step_id) is not None and self.state.records[step_id].status == "running":
            self._emit("step_progress", step_id, {"fraction": fraction, "message": message})

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None:
        """Journal an event about the run that is not a step transition (``model_call``, ``escalation``,
        ``answer``, ``allocation``, ``forecast``): the planning loop, the allocator and the forecast report through
        this."""
        if kind not in _RECORDED:
            raise ValueError(f"record() takes {', '.join(_RECORDED)} events, not {kind}")
        self._emit(kind, step, data)

    async def _retry_after(self, rec: StepRecord, delay: float) -> None:
        await asyncio.sleep(delay)
        self._timers.pop(rec.id, None)
        if self.state.records.get(rec.id) is rec and rec.status == "ready":
            self._enqueue(self, rec.id, self._clock.now())
            self._pump()

    # -- people in the run ------------------------------------------------------------------------------------
    def approve(self, step: str, approve: bool = True, reason: str | None = None, *, by: str | None = None) -> None:
        """Answer step ``step``'s request for approval: approved, it runs; rejected, it fails with kind ``rejected``.

        A rejection is never retried; it runs the step's fallback if it has one, else it is a final failure. The
        first reply is final: :class:`ReplyRefused` (a :class:`RunError`) names the one that stands if the step
        already has one. Raises :class:`RunError` if the run is over, has no such step, or the step is not waiting
        for an approval. ``by``: who answers, for the journal and for the message refusing a later reply.
        """
        self._decide(step, approve, reason, by, None)

    def _decide(self, step: str, approve: bool, reason: str | None, by: str | None, reply: int | None) -> None:
        rec = self._waiting(step, "waiting_approval", "an approval")
        timer = self._timers.pop(step, None)
        if timer is not None:
            timer.cancel()
        self._answered(step, "approval_given", _given({"approve": approve, "reason": reason}, by, reply))
        if approve:
            self._pump()
            return
        message = f"rejected: {reason}" if reason else "rejected"
        if self._host.redact is not None:
            message = self._host.redact(message)
        self._give_up(rec, self.plan.steps[step], rec.attempts, "rejected", message)
        self._pump()
        self._check_done()

    def send(self, step: str, value: Any, *, by: str | None = None) -> None:
        """Give ``value`` to step ``step`` (a ``human.input`` call waiting for it): it becomes the step's output.

        Raises :class:`InputRejected` (the step keeps waiting) if the value fails the step's JSON schema,
        :class:`ReplyRefused` naming the value that stands if the step already had one (the first reply is final),
        and :class:`RunError` if the run is over, has no such step, or the step is not waiting for a value.
        """
        self._give(step, value, by, None)

    def _give(self, step: str, value: Any, by: str | None, reply: int | None) -> None:
        rec = self._waiting(step, "waiting_input", "a value")
        check_value(rec.input_schema, value, self.id, step)
        self._answered(step, "input_given", _given({"value": value}, by, reply))
        waiter = self._inputs.pop(step, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _answered(self, step: str, kind: EventKind, data: Mapping[str, Any]) -> None:
        """Emit the decision for ``step``'s wait, and remember it: a later reply is refused naming it."""
        self._emit(kind, step, data)
        self._answers[step] = Event(self.id, kind, self._now(), step, data)

    def apply_reply(self, step: str, reply: Mapping[str, Any], pos: int | None = None) -> bool:
        """Apply a ``step_reply`` another process journaled at ``pos`` ({approve, reason, by} or {value, by}); False
        if it does not apply (a reply applied first stands, the step stopped waiting, or the value fails the
        schema). Each journaled reply is taken once, whichever path (the control watcher, a resume, this process's
        HTTP route) brings it first."""
        if pos is not None:
            if pos in self._replies_taken:
                return False
            self._replies_taken.add(pos)
        by = reply.get("by")
        try:
            if "value" in reply:
                self._give(step, reply["value"], by, pos)
            else:
                self._decide(step, bool(reply.get("approve")), reply.get("reason"), by, pos)
        except (RunError, InputRejected):
            return False
        return True

    def _waiting(self, sid: str, status: str, what: str) -> StepRecord:
        rec = self.state.records.get(sid)
        answer = self._answers.get(sid)
        if answer is not None and rec is not None and rec.status != status:
            raise refusal(self.id, sid, answer)  # also once the run ended (a rejection ends most)
        if self.finished or self._tg is None:
            raise RunError(f"run '{self.id}' is not running")
        if rec is None:
            raise RunError(f"run '{self.id}' has no step '{sid}'{did_you_mean(sid, self.state.records)}")
        if rec.status != status:
            raise RunError(f"step '{sid}' of run '{self.id}' is not waiting for {what} (it is {rec.status})")
        return rec

    def _request_approval(self, sid: str) -> None:
        approval = self.plan.steps[sid].approval
        # The question as the approver must read it: its references rendered on the outputs there are now (the
        # values redacted as an error text is: an output's secret stays out of the journal).
        prompt = render_text(approval, self.outputs) if isinstance(approval, str) else None
        if prompt is not None and prompt != approval and self._host.redact is not None:
            prompt = self._host.redact(prompt)
        self._emit("approval_requested", sid, {"prompt": prompt})
        self._arm_deadline(self.state.records[sid])

    def _arm_deadline(self, rec: StepRecord) -> None:
        """Bound an approval wait by the step's ``timeout``, counted from the request (also across a resume)."""
        timeout = self.plan.steps[rec.id].timeout
        if timeout is not None and self._tg is not None:
            since = rec.waiting_since if rec.waiting_since is not None else self._now()
            delay = since + timeout - self._now()
            self._timers[rec.id] = self._tg.create_task(self._approval_deadline(rec, delay, timeout))

    async def _approval_deadline(self, rec: StepRecord, delay: float, timeout: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        self._timers.pop(rec.id, None)
        if self.state.records.get(rec.id) is rec and rec.status == "waiting_approval":
            self._give_up(rec, self.plan.steps[rec.id], rec.attempts, "timeout", f"no approval within {timeout:g}s")
            self._pump()
            self._check_done()

    def _rewait(self) -> None:
        """After a resume: approvals still wait (under their deadline); replies journaled meanwhile apply now."""
        for rec in list(self.state.records.values()):
            if rec.status == "waiting_approval":
                reply = rec.reply
                self._arm_deadline(rec)
                if reply is not None:
                    self.apply_reply(rec.id, reply, reply.get("pos"))

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        """Wait for a person to give step ``step_id`` a value (StepSink: the ``human.input`` tool calls this)."""
        rec = self.state.records[step_id]
        if rec.given is not None:  # given before the run was interrupted: the step resumes with it
            return rec.given[0]
        reply = rec.reply  # a value journaled while no process ran the run
        waiter: asyncio.Future[Any] = self._loop.create_future()
        self._inputs[step_id] = waiter
        self._emit("input_requested", step_id, {"prompt": prompt, "schema": schema})
        if reply is not None:
            self.apply_reply(step_id, reply, reply.get("pos"))
        try:
            return await waiter
        finally:
            if self._inputs.get(step_id) is waiter:
                del self._inputs[step_id]

    # -- changing the plan while it runs ------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the run open while the block runs (a planner is still writing), even if no step is active."""
        self._holds += 1
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        """Give back one hold (from :meth:`hold`, or ``Engine.start``/``Engine.resume`` with ``hold=True``).

        Raises :class:`RunError` if the run holds none: a hold is not journaled, so a run resumed without
        ``hold=True`` has none, and counting below zero would keep it open for ever.
        """
        if self._holds <= 0:
            raise RunError(f"run '{self.id}' holds nothing to release (a resumed run holds only with hold=True)")
        self._holds -= 1
        self._check_done()

    @property
    def position(self) -> int:
        """How many events the run's state has seen: what a re-planner records as the state it looked at."""
        return self.state.events_applied

    def _check_alive(self) -> None:
        if self.finished or self._tg is None or self._cancel_reason is not None:
            raise RunError(f"run '{self.id}' is not running: its plan can no longer change")

    def _idempotent_ids(self, steps: Iterable[Step]) -> list[str]:
        return [s.id for s in steps
                if (s.idempotent if s.idempotent is not None else self._tools[s.tool].idempotent)]

    def extend(self, steps: Sequence[Step | Mapping[str, Any]], *, version: int | None = None,
               **meta: Any) -> list[str]:
        """Add steps to the running plan (streaming admission); they start as soon as their inputs exist.

        Raises :class:`PlanInvalid` naming every problem (nothing is added then). ``meta`` (e.g. ``trigger``,
        ``model_started_at``, ``model_finished_at``) is recorded on the plan version.
        """
        self._check_alive()
        parsed = [s if isinstance(s, Step) else parse_step(s) for s in steps]
        version = self.plan.version if version is None else version
        if parsed:
            spec = self.plan.spec.model_copy(update={"steps": (*self.plan.spec.steps, *parsed)})
            self._dispatch.adopt(spec)
            validate_plan(spec, self._tools, self._dispatch.capacities, source=f"run '{self.id}'")
        self._emit("steps_added", None, {"steps": parsed, "version": version,
                                         "idempotent": self._idempotent_ids(parsed), **meta})
        self._pump()
        if self._spec is not None:  # a new step may start on predictions of the steps it waits for
            self._spec.schedule()
        return [s.id for s in parsed]

    def propose(self, proposal: PlanSpec | Mapping[str, Any], *, trigger: str = "replan", seen: int | None = None,
                max_staleness: int | None = None, **meta: Any) -> SpliceDiff:
        """Splice a proposed remaining plan in as the next version, matched against the state *now*.

        Finished steps it restates or refers to keep their results; running ones it restates are adopted; steps it
        leaves out are cancelled (running) or dropped (waiting). Raises :class:`StaleProposal` when it depends on
        steps that died since ``seen`` (a :attr:`position`) or when more than ``max_staleness`` events happened
        since then, and :class:`PlanInvalid` when it is invalid. Returns the diff, which is also journaled.
        """
        self._check_alive()
        if seen is not None and max_staleness is not None and self.position - seen > max_staleness:
            raise StaleProposal(
                f"the proposal is stale: {self.position - seen} events happened since the re-planner looked "
                f"(limit {max_staleness})", [])
        spec = proposal if isinstance(proposal, PlanSpec) else parse_plan_document(proposal, "proposal")
        merged, renames = merge_proposal(spec, self.plan, self.state.records, source="proposal")
        self._dispatch.adopt(merged)
        version = self.plan.version + 1
        new_plan = validate_plan(merged, self._tools, self._dispatch.capacities, version=version,
                                 parent=self.plan.version, source="proposal")
        diff = splice_diff(self.state.records, self.plan, new_plan)
        # Take the tasks to cancel before the new version is applied: applying it may start a replacement step
        # under the same id at once, and that one must keep running.
        doomed = [task for sid in diff.cancelled if (task := self._tasks.pop(sid, None)) is not None]
        self._emit("plan_version", None, {
            "plan": merged, "version": version, "parent": self.plan.version, "trigger": trigger,
            "seen": seen, "renamed": renames, "idempotent": self._idempotent_ids(new_plan.steps.values()),
            **diff.as_dict(), **meta,
        })
        for task in doomed:
            self._cancel_attempt(task)
        self._pump()
        if self._spec is not None:  # a new version: other producers, other steps to speculate on
            self._spec.schedule()
        self._check_done()
        return diff


class Engine:
    """Runs plans. Use as ``async with Engine(journal) as engine`` (or :func:`planweave.open_engine`)."""

    def __init__(
        self,
        journal: Journal,
        *,
        clock: Clock | None = None,
        concurrency: int | None = DEFAULT_CONCURRENCY,
        capacities: Mapping[str, int] | None = None,
        tools: ToolCatalog | None = None,
        aging: float = 1.0,
        redact: Callable[[Any], Any] | None = None,
        max_output_bytes: int | None = DEFAULT_MAX_OUTPUT_BYTES,
        executor: Executor | None = None,
        gc_freeze_every: int | None = DEFAULT_FREEZE_EVERY,
        cache: bool = True,
    ) -> None:
        """``concurrency`` bounds the steps running at once across runs (default 64; ``None``: unlimited).

        ``redact`` (optional) rewrites what is journaled: step outputs and error texts (e.g. hiding secrets); a
        :class:`PlanSeal` also hides them in the journaled plans and puts them back when a run is resumed.
        ``max_output_bytes`` bounds a step's encoded output (default 16 MiB; ``None``: unlimited): a larger one
        fails the step with kind ``output`` and nothing is stored.
        ``executor`` performs the steps' tool calls (default :class:`~planweave.engine.executor.InProcessExecutor`:
        in this loop); one with an ``aclose`` is closed with the engine.
        ``gc_freeze_every`` (default 1000; ``None``: never) freezes the garbage collector's view of the heap every
        that many started runs, so that thousands of concurrent runs' state is not walked by every full collection
        (:mod:`planweave.engine.collector`).
        ``cache=False`` (``--no-cache``): no step reuses a cached output; outputs are still indexed (docs/caching.md).
        """
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if max_output_bytes is not None and max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be at least 1, got {max_output_bytes}")
        self.max_output_bytes = max_output_bytes
        self.journal = journal
        self.clock: Clock = clock or RealClock()
        self.tools = tools
        self.redact = redact
        self.seal = redact if isinstance(redact, PlanSeal) else None
        self.executor: Executor = executor or InProcessExecutor()
        self._dispatch = Dispatcher(Scheduler(concurrency, capacities, aging=aging))
        self.collector = CollectorPolicy(gc_freeze_every)
        self._runs: dict[str, Run] = {}  # active runs only: finished ones are dropped, so a long-lived engine
        # does not keep every step record it ever ran (memory, and garbage-collector work)
        self._listeners: list[EventListener] = []
        self._tg_cm = asyncio.TaskGroup()
        self._tg = self._tg_cm
        self._open = False
        self._control_task: asyncio.Task[None] | None = None
        self._loop_watch: LoopWatch | None = None
        self._spawned: set[asyncio.Task[Any]] = set()  # Engine.spawn's tasks still going: cancelled at close
        # What the engine's adapters keep per engine, keyed by their own type (the live forecasts' shared refresh
        # budget): it lives as long as the engine. Not a WeakKeyDictionary of engines: a compiled Engine (setup.py)
        # cannot be weakly referenced.
        self.shared: dict[type, Any] = {}
        self._host = RunHost(self.clock, journal, self.executor, self._dispatch, redact, self.seal, max_output_bytes,
                             self._listeners, self._start_run_task, self._forget, cache)

    @property
    def capacities(self) -> Mapping[str, int]:
        return self._dispatch.capacities

    @property
    def concurrency(self) -> int | None:
        return self._dispatch.scheduler.concurrency

    def _forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        if not self._runs:
            self.collector.idle()

    def _start_run_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._tg.create_task(coro, name=name)

    async def __aenter__(self) -> Engine:
        await self._tg_cm.__aenter__()
        self._open = True
        self._loop_watch = LoopWatch(asyncio.get_running_loop(), self._stalled).start()
        if self.journal.durable and isinstance(self.clock, RealClock):
            self._control_task = self._tg.create_task(self._watch_control(), name="planweave-control")
        return self

    async def _watch_control(self, interval: float = 0.5) -> None:
        """Apply cancellations and replies that other processes wrote to the shared journal (``planweave cancel``,
        ``approve``, ``send``).

        This is the control plane, not dispatch: steps are never started by it, so a coarse interval is fine. Each
        turn reads the new events of each kind across all runs, so it costs the requests written, not the runs
        active (two reads per run per turn did not keep up with 10,000 runs: bench scale). A run resumed since the
        last turn first catches up on its own events after its fold, which an all-runs read may have passed.
        """
        cursors: dict[EventKind, int] = {"step_reply": 0, "run_cancel_requested": 0}  # positions read up to
        known: set[str] = set()  # runs the all-runs reads serve
        while True:
            await asyncio.sleep(interval)
            resumed = [run for run_id, run in self._runs.items() if run_id not in known and run.state.last_pos]
            known.update(self._runs)
            known.difference_update(run.id for run in resumed)
            for kind in cursors:
                events = await self.journal.read(None, after=cursors[kind], kind=kind)
                if events:
                    cursors[kind] = max(cursors[kind], events[-1].pos or 0)
                for event in events:
                    run = self._runs.get(event.run_id)
                    if run is not None and event.run_id in known:
                        _apply_control(run, event)
            for run in resumed:
                for event in (*await self.journal.read(run.id, after=run.state.last_pos, kind="step_reply"),
                              *await self.journal.read(run.id, kind="run_cancel_requested")):
                    _apply_control(run, event)
                known.add(run.id)
            known.intersection_update(self._runs)  # ended runs are dropped from the engine: forget them too

    def _stalled(self, task: asyncio.Task[object] | None, frame: FrameType | None, since: float) -> None:
        """The event loop is blocked (:class:`LoopWatch`, in its thread): name the step whose tool blocks it.

        A warning is logged at once; when a step's tool (not the engine itself) is the culprit, a ``warning`` event
        with the whole duration is journaled for the step as soon as the loop turns again.
        """
        culprit = self._blocking_step(task, frame)
        at = _location(frame)
        blocked_s = time.monotonic() - since
        if culprit is None:
            _log.warning("the event loop has been blocked for %.1fs (in %s)", blocked_s, at)
            return
        run, sid = culprit
        tool = run.plan.steps[sid].tool if sid in run.plan.steps else "?"
        _log.warning("step '%s' (tool '%s') of run '%s' has blocked the event loop for %.1fs (in %s): an async "
                     "tool must not block (a sync function runs in a worker thread), and its timeout cannot fire "
                     "while it does", sid, tool, run.id, blocked_s, at)
        run.warn_blocked(sid, {"tool": tool, "where": at}, since)

    def _blocking_step(self, task: asyncio.Task[object] | None, frame: FrameType | None) -> tuple[Run, str] | None:
        """The (run, step) whose tool is running in ``frame``, if ``task`` is a step attempt of this engine.

        The innermost Python frame decides: in planweave's own code (bar the built-in tools) it is the engine's work,
        not the tool's. Not a walk up to the attempt's frame: a compiled engine (setup.py) has no Python frames.
        """
        if frame is None or _own_code(frame.f_code.co_filename):
            return None  # not inside a tool call: the engine's own work (or none of ours) blocked the loop
        for run in list(self._runs.values()):
            sid = run.step_of(task)
            if sid is not None:
                return run, sid
        return None

    async def __aexit__(self, *exc_info: Any) -> None:
        self._open = False
        if self._loop_watch is not None:
            self._loop_watch.stop()
        if self._control_task is not None:
            self._control_task.cancel()
        for run in list(self._runs.values()):
            run.interrupt()  # not cancel: the journal keeps the run resumable
        for task in list(self._spawned):  # e.g. a planner waiting for its run: it must not keep the engine open
            task.cancel()
        exc_type = exc_info[0]
        failure: BaseException | None = None
        try:
            if exc_type is not None and not issubclass(exc_type, asyncio.CancelledError):
                # Python 3.11's TaskGroup would wrap the body's exception in an ExceptionGroup: let it propagate.
                await self._tg_cm.__aexit__(None, None, None)
            else:
                await self._tg_cm.__aexit__(*exc_info)
        except BaseException as exc:
            failure = exc
        # Not in a `finally`: mypyc (setup.py) miscompiles an await there (a stale CancelledError came out).
        if isinstance(self.tools, Closable):  # e.g. a Toolbox: its http.* connection pool
            await self.tools.aclose()
        if isinstance(self.executor, Closable):  # e.g. a ThreadExecutor's worker thread
            await self.executor.aclose()
        if failure is not None:
            raise failure

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` in the engine's task group (e.g. a planning loop): it is cancelled when the engine closes."""
        self._check_open()
        task = self._tg.create_task(coro, name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task

    def subscribe(self, listener: EventListener) -> None:
        """Call ``listener`` with every event of every run started after this call."""
        self._listeners.append(listener)

    def get(self, run_id: str) -> Run:
        """A run this engine is running now (started or resumed, not finished)."""
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFound(f"run '{run_id}' is not active in this engine") from None

    def interrupt(self, run_id: str) -> None:
        """Stop running ``run_id`` here without deciding its outcome (its lease moved to another worker): the
        journal keeps it resumable, its :meth:`Run.wait` raises RunError, and this engine may resume it later."""
        run = self._runs.pop(run_id, None)
        if run is not None:
            run.interrupt()

    # -- starting and resuming ------------------------------------------------------------------------------------
    def _catalog(self, tools: ToolCatalog | None) -> ToolCatalog:
        if tools is not None:
            return tools
        if self.tools is None:
            from planweave.tools import builtin_tools  # the default toolbox; the core only sees ToolCatalog

            self.tools = builtin_tools()
        return self.tools

    def _check_open(self) -> None:
        if not self._open:
            raise RunError("the engine is not open: use 'async with Engine(...)' or planweave.open_engine()")

    async def start(
        self,
        plan: Plan | PlanSpec | Mapping[str, Any],
        *,
        tools: ToolCatalog | None = None,
        run_id: str | None = None,
        source: str = "plan",
        hold: bool = False,
        on_event: EventListener | None = None,
        on_failure: OnFailure | None = None,
        limits: LimitsRecord | None = None,
        priority: float = 0.0,
        speculation: SpeculationSpec | SpeculationMode | None = None,
        predictor: Predictor | None = None,
    ) -> Run:
        """Validate ``plan`` against the tools and capacities and start running it; return the :class:`Run`.

        A :class:`Plan` that :func:`~planweave.core.plan.graph.validate_plan` checked against the same capacities and
        the same tool objects (``Plan.checked_against``) is not checked again: validate a plan once and start it
        many times (rollouts, benchmarks) without paying for the checks each time.

        ``priority`` orders the run's model calls against other runs' at a shared endpoint (higher first); it is
        journaled (``options.priority`` of ``run_created``) and a resume keeps it.

        ``hold=True`` starts the run holding it open even with nothing to do (a planner will add steps); the
        caller must call :meth:`Run.release` once. ``on_event`` sees every event of the run from the first one
        (:meth:`Run.subscribe` after ``start`` returns misses those emitted while it started).
        ``on_failure`` (``stop`` or ``continue``) says what a step failing for good does; it defaults to the plan's
        ``on_failure``, else ``continue`` for a held run (a planner may repair the failure) and ``stop`` otherwise.
        ``limits`` (:meth:`RunLimits.journaled <planweave.engine.limits.RunLimits.journaled>`: budget, deadline,
        model...) is journaled in ``run_created`` as ``options.limits``, for the edges that enforce them to apply them
        again on resume (:class:`planweave.engine.limits.JournaledLimits`).
        ``speculation`` (a policy, or a mode ``off``/``safe``/``eager`` keeping the plan's limits) overrides the
        plan's ``speculation:``; journaled as ``options.speculation``, which a resume keeps (docs/speculation.md).
        ``predictor`` (e.g. :class:`planweave.models.predictor.ModelPredictor`) is asked for the outputs of running
        steps that nothing else predicts.
        """
        if on_failure not in (None, "stop", "continue"):
            raise ValueError(f"on_failure must be 'stop' or 'continue', got {on_failure!r}")
        self._check_open()
        catalog = self._catalog(tools)
        if isinstance(plan, Plan):
            spec = plan.spec
        elif isinstance(plan, PlanSpec):
            spec = plan
        else:
            spec = parse_plan_document(plan, source)
        self._dispatch.adopt(spec)
        if isinstance(plan, Plan) and plan.version == 1 and plan.parent is None and plan.checked_against(
                catalog, self.capacities):
            validated = plan  # validated against these tools and capacities already: not again (RL rollouts, CLI)
        else:
            validated = validate_plan(spec, catalog, self.capacities, source=source)
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
        elif run_id in self._runs or await self.journal.read(run_id):
            raise RunError(f"run id '{run_id}' is already in the journal {self.journal.url}")
        idempotent = validated.idempotent_steps(catalog)
        state = RunState(run_id, validated, idempotent)
        on_failure = on_failure or spec.on_failure or ("continue" if hold else "stop")
        policy = resolve_policy(spec, speculation)
        run = Run(self._host, run_id, catalog, state, holds=int(hold), speculation=policy, predictor=predictor)
        run.priority = priority
        if on_event is not None:
            run.subscribe(on_event)
        self._runs[run_id] = run
        self.collector.run_started(len(validated.steps))
        # As a document, not the spec: a spec's dump drops a step's explicit `timeout: null` (no limit), and read
        # back that step would take the plan's defaults.timeout. Journals check it in append. A journal that keeps
        # nothing (null://), with nobody listening, gets the spec itself, as RunCreatedData allows in process: the
        # document is for readers, and there are none (to_document: ~4 % of a no-op step, docs/benchmarks.md).
        read = on_event is not None or bool(self._listeners) or not isinstance(self.journal, NullJournal)
        try:
            await run.begin("run_created", {
                "plan": validated.to_document() if read else spec,
                "version": validated.version,
                "idempotent": idempotent,
                "source": source,
                "on_failure": on_failure,
                "options": {"concurrency": self.concurrency, "capacities": dict(self.capacities),
                            **({"limits": limits.to_json()} if limits is not None else {}),
                            **({"priority": priority} if priority else {}),
                            **({"speculation": policy.model_dump(mode="json")}
                               if policy.mode != "off" or speculation is not None else {})},
                "owner": _owner(),
            })
        except EventNotRecorded as exc:
            self._runs.pop(run_id, None)
            raise EventNotRecorded(f"run '{run_id}' was not started: {exc}") from None
        return run

    async def resume(self, run_id: str, *, tools: ToolCatalog | None = None, retry_unknown: bool = False,
                     on_event: EventListener | None = None, hold: bool = False,
                     speculation: SpeculationSpec | SpeculationMode | None = None,
                     predictor: Predictor | None = None) -> Run:
        """Continue an interrupted run from its journal: finished steps are not run again, their outputs reused.

        Steps that were running are re-run if idempotent; otherwise they become ``unknown`` and the run stops short
        of them unless ``retry_unknown``. Speculative attempts that were in flight are forgotten; the run speculates
        as it was started to (``options.speculation``), unless ``speculation`` says otherwise.
        """
        self._check_open()
        if run_id in self._runs:
            raise RunError(f"run '{run_id}' is already running in this engine")
        events = await self.journal.read(run_id)
        if not events:
            raise RunNotFound(f"no run '{run_id}' in the journal {self.journal.url}")
        if self.seal is not None:
            events = self.seal.unseal(events)
        catalog = self._catalog(tools)
        state = RunState.from_events(run_id, events)
        self._dispatch.adopt(state.plan.spec)
        # The tools of this process must still fit the plan (a resumed run may be given other --tools).
        validate_plan(state.plan.spec, catalog, self.capacities, version=state.plan.version,
                      source=f"run '{run_id}'")
        if state.status in ("succeeded", "cancelled"):
            raise RunError(f"run '{run_id}' already ended: {state.status}; there is nothing to resume")
        if state.failed_by is not None:
            raise RunError(f"run '{run_id}' was ended failed on purpose ({state.failed_by}); there is nothing to "
                           "resume")
        refs = [r.output_ref for r in state.records.values() if r.status == "succeeded" and r.output_ref]
        blobs = await self.journal.get_blobs(refs)
        if speculation is None:
            speculation = _journaled_speculation(events)
        run = Run(self._host, run_id, catalog, state, holds=int(hold),
                  speculation=resolve_policy(state.plan.spec, speculation), predictor=predictor)
        run.priority = _journaled_priority(events)
        if on_event is not None:
            run.subscribe(on_event)
        for rec in state.records.values():
            if rec.status == "succeeded" and rec.output_ref is not None:
                if rec.output_ref not in blobs:
                    raise JournalError(f"run '{run_id}': the output of step '{rec.id}' is missing from the journal")
                run.outputs[rec.id] = blobs[rec.output_ref]
        self._runs[run_id] = run
        self.collector.run_started(len(state.plan.steps))
        await run.begin("run_resumed", {"retry_unknown": retry_unknown, "owner": _owner()})
        return run


_log = logging.getLogger("planweave.engine")
_RECORDED: tuple[EventKind, ...] = ("model_call", "model_released", "escalation", "answer", "warning", "allocation",
                                    "forecast")




def _journal_warning(run: Run, sid: str, data: Mapping[str, Any], since: float) -> None:
    """Journal that step ``sid``'s tool blocked the loop from ``since`` (monotonic) until now."""
    if not run.finished:
        blocked_s = time.monotonic() - since
        message = (f"tool '{data['tool']}' blocked the event loop for {blocked_s:.1f}s (in {data['where']}): "
                   "an async tool must not block, and its timeout cannot fire while it does")
        run.record("warning", {**data, "message": message, "blocked_s": round(blocked_s, 3)}, sid)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TOOLS_DIR = os.path.join(_PACKAGE_DIR, "tools") + os.sep


def _own_code(filename: str) -> bool:
    """Whether ``filename`` is planweave's own code, the built-in tools excepted (they are tools like any other)."""
    return filename.startswith(_PACKAGE_DIR) and not filename.startswith(_TOOLS_DIR)


def _location(frame: FrameType | None) -> str:
    """``function (file:line)`` of the innermost Python frame, for a warning."""
    if frame is None:
        return "unknown code"
    code = frame.f_code
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"


def _given(data: dict[str, Any], by: str | None, reply: int | None) -> dict[str, Any]:
    """An ``approval_given``/``input_given`` payload with who answered and the position of the journaled
    ``step_reply`` it applies, when there are (an anonymous in-process answer has neither: the payload stays as
    older journals hold it)."""
    if by is not None:
        data["by"] = by
    if reply is not None:
        data["reply"] = reply
    return data


def _apply_control(run: Run, event: Event) -> None:
    """Apply a ``step_reply`` or ``run_cancel_requested`` another process journaled for ``run``."""
    if event.kind == "step_reply":
        # A reply at or before the run's fold point was folded already (a resumed run applied it).
        if event.step is not None and not run.finished and (event.pos or 0) > run.state.last_pos:
            run.apply_reply(event.step, event.data, event.pos)
    elif event.at >= (run.state.created_at or 0.0):
        run.cancel(event.data.get("reason", "cancelled from another process"))


def process_alive(owner: Mapping[str, Any]) -> bool:
    """Whether the process that owns a run is alive (only knowable on the same host)."""
    if owner.get("host") != socket.gethostname():
        return True  # another machine: assume it is, and let it pick the request up
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def request_cancel(journal: Journal, run_id: str, reason: str = "cancelled by user") -> str:
    """Cancel a run recorded in ``journal`` from outside the process running it; return what was done.

    If the owning process is alive, a ``run_cancel_requested`` event is written and that process's engine cancels
    the run within a second. If it is gone (crashed), the run is marked cancelled directly.
    """
    events = await journal.read(run_id)
    if not events:
        raise RunNotFound(f"no run '{run_id}' in the journal {journal.url}")
    last_status = "running"
    owner: Mapping[str, Any] = {}
    for event in events:
        if event.kind in ("run_created", "run_resumed"):
            owner = event.data.get("owner", {})
            last_status = "running"
        elif event.kind == "run_finished":
            last_status = event.data["status"]
    if last_status in ("succeeded", "cancelled"):
        raise RunError(f"run '{run_id}' already ended: {last_status}")
    now = RealClock().now()
    if last_status == "running" and process_alive(owner):
        journal.append(Event(run_id, "run_cancel_requested", now, None, {"reason": reason}))
        await journal.flush()
        return "requested"
    journal.append(Event(run_id, "run_cancelled", now, None, {"reason": reason}))
    journal.append(Event(run_id, "run_finished", now, None, {"status": "cancelled", "error": reason}))
    await journal.flush()
    return "cancelled"


def cancel_at_deadline(engine: Engine, run: Run, seconds: float, *,
                       deadline: float | None = None) -> asyncio.Task[None]:
    """Cancel ``run`` with reason ``deadline of {deadline}s reached`` if it is still going ``seconds`` from now
    (``deadline``: the one the run was given, when a resume waits only for what is left of it; default ``seconds``).

    The wait runs in the engine's task group on the engine's clock; it ends with the run (or the engine). A run
    stopped by its deadline ends ``cancelled``, like one a user cancelled: what finished is kept, and ``resume``
    continues it.
    """

    async def watch() -> None:
        try:
            async with asyncio.timeout(seconds):
                await run.wait()
        except TimeoutError:
            run.cancel(f"deadline of {seconds if deadline is None else deadline:g}s reached")
        except RunError:
            pass  # interrupted: the engine is closing, and the run stays resumable

    return engine.spawn(watch(), name=f"planweave-deadline-{run.id}")


def check_value(schema: Mapping[str, Any] | None, value: Any, run_id: str, step: str) -> None:
    """Raise :class:`InputRejected` naming the reason if ``value`` does not satisfy the JSON ``schema``."""
    if schema is None:
        return
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        at = f" at '{where}'" if where else ""
        raise InputRejected(f"run '{run_id}', step '{step}': the value is refused{at}: {error.message}")


def _owner_of(events: Sequence[Event]) -> Mapping[str, Any]:
    owner: Mapping[str, Any] = {}
    for event in events:
        if event.kind in ("run_created", "run_resumed"):
            owner = event.data.get("owner", {})
    return owner


#: How long a reply from another process waits for the run's process to apply it (its control watcher looks twice a
#: second) before it is reported ``pending``.
REPLY_CONFIRM_S = 30.0
_REPLY_POLL_S = 0.1
_STOPPED = frozenset({"step_failed", "step_cancelled", "step_skipped"})


async def _send_reply(journal: Journal, run_id: str, step: str, status: str, reply: dict[str, Any],
                      by: str | None, run: Run | None, confirm_s: float) -> str:
    events = await journal.read(run_id)
    if not events:
        raise RunNotFound(f"no run '{run_id}' in the journal {journal.url}")
    state = RunState.from_events(run_id, events)
    if state.status != "running":
        raise RunError(f"run '{run_id}' already ended: {state.status}")
    rec = state.records.get(step)
    if rec is None:
        raise RunError(f"run '{run_id}' has no step '{step}'{did_you_mean(step, state.records)}")
    standing = standing_reply(reply_events(events, step))
    if standing is not None:
        raise refusal(run_id, step, standing)
    if rec.status != status:
        what = "an approval" if status == "waiting_approval" else "a value"
        raise RunError(f"step '{step}' of run '{run_id}' is not waiting for {what} (it is {rec.status})")
    if "value" in reply:
        check_value(rec.input_schema, reply["value"], run_id, step)
    if by is not None:
        reply["by"] = by
    written = await append_reply(journal, Event(run_id, "step_reply", RealClock().now(), step, reply))
    if not written.recorded:  # another reply was journaled between the read above and the write
        raise refusal(run_id, step, written.event)
    if run is not None and not run.finished:  # the run is here: it applies the reply now, not at the watcher's turn
        if not run.apply_reply(step, written.event.data, written.event.pos):
            confirm_s = 0.0  # it stopped waiting meanwhile: what the journal says now is the answer
        await journal.flush()
    return await _confirmed(journal, written, _owner_of(events), confirm_s)


async def _confirmed(journal: Journal, written: ReplyWritten, owner: Mapping[str, Any], confirm_s: float) -> str:
    """Wait until the run's process applied the reply just journaled (``applied``) or a reply it took first stands
    (raises ReplyRefused); ``recorded`` when no process runs the run (it applies when the run resumes), ``pending``
    when the process named as its owner has not answered within ``confirm_s``."""
    mine = written.event
    run_id, step, pos = mine.run_id, mine.step, mine.pos or 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + confirm_s
    seen = pos
    while True:
        for event in await journal.read(run_id, after=seen):
            seen = event.pos or seen
            kind = event.kind
            if kind == "run_created" or kind == "run_resumed":
                owner = event.data.get("owner", {})
            elif kind == "run_finished":
                return "recorded"  # ended before it applied the reply: a resume applies it
            elif event.step != step:
                continue
            elif kind in GIVEN_KINDS:
                if event.data.get("reply") == pos:
                    return "applied"
                raise refusal(run_id, step or "", event)  # the run's process took another reply first
            elif kind in _STOPPED:
                raise RunError(f"step '{step}' of run '{run_id}' stopped waiting before the reply applied ({kind}: "
                               f"{event.data.get('error') or event.data.get('reason') or 'no reason given'})")
        if not process_alive(owner):
            return "recorded"
        if loop.time() >= deadline:
            return "pending"
        await asyncio.sleep(_REPLY_POLL_S)


async def send_approval(journal: Journal, run_id: str, step: str, *, approve: bool, reason: str | None = None,
                        by: str | None = None, run: Run | None = None, confirm_s: float = REPLY_CONFIRM_S) -> str:
    """Approve or reject a step waiting for approval in a run recorded in ``journal``, from any process.

    The first reply is final: the reply is journaled only if none stands for the step, checked and written in one
    transaction, and :class:`ReplyRefused` (a :class:`RunError`) names the one that does (who, when, approved or
    rejected). Returns ``applied`` once the process running the run applied it, ``recorded`` if no process runs it
    (it applies when the run resumes), or ``pending`` if the process named as the run's owner did not apply it
    within ``confirm_s`` seconds. Raises ReplyRefused too if that process took another reply first (an in-process
    ``Run.approve``), :class:`RunNotFound`, or :class:`RunError` if the run ended, has no such step, or the step is
    not waiting for an approval. ``by`` names who answers; ``run``: the run, if this process runs it (the reply
    applies at once instead of through the control watcher).
    """
    return await _send_reply(journal, run_id, step, "waiting_approval", {"approve": approve, "reason": reason}, by,
                             run, confirm_s)


async def send_input(journal: Journal, run_id: str, step: str, value: Any, *, by: str | None = None,
                     run: Run | None = None, confirm_s: float = REPLY_CONFIRM_S) -> str:
    """Give a value to a step waiting for input (``human.input``) in a run recorded in ``journal``, from any process.

    Returns and refuses like :func:`send_approval` (the first value is final); raises :class:`InputRejected` (the
    step keeps waiting) if the value fails the step's schema.
    """
    return await _send_reply(journal, run_id, step, "waiting_input", {"value": value}, by, run, confirm_s)


def _journaled_priority(events: Sequence[Event]) -> float:
    """The priority a run was started with (``options.priority`` of its ``run_created``; 0 when none was given)."""
    for event in events:
        if event.kind == "run_created":
            options = event.data.get("options") or {}
            return float(options.get("priority") or 0.0)
    return 0.0


def _journaled_speculation(events: Sequence[Event]) -> SpeculationSpec | None:
    """The speculation a run was started with (``options.speculation`` of its ``run_created``), if any."""
    for event in events:
        if event.kind == "run_created":
            options = event.data.get("options") or {}
            raw = options.get("speculation")
            return SpeculationSpec.model_validate(raw) if raw else None
    return None
