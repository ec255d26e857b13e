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
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from planweave.core.clock import Clock, RealClock
from planweave.core.errors import (
    EventNotRecorded,
    JournalError,
    RunError,
    RunNotFound,
    did_you_mean,
)
from planweave.core.events import Event, EventKind
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.core.plan.model import PlanSpec, SpeculationMode, SpeculationSpec, Step
from planweave.core.replies import GIVEN_KINDS, refusal, reply_events, standing_reply
from planweave.core.scheduler import Scheduler
from planweave.core.speculation import Predictor
from planweave.core.splice import SpliceDiff
from planweave.core.state import OnFailure, RunState, RunStatus
from planweave.engine.attempts import Attempts
from planweave.engine.changes import PlanChanges
from planweave.engine.collector import DEFAULT_FREEZE_EVERY, CollectorPolicy
from planweave.engine.dispatch import Dispatcher
from planweave.engine.emission import Emission
from planweave.engine.executor import Executor, InProcessExecutor
from planweave.engine.hooks import SpeculationHooks
from planweave.engine.host import EventListener, RunHost, RunResult
from planweave.engine.lifecycle import Lifecycle
from planweave.engine.loopwatch import LoopWatch
from planweave.engine.people import People, check_value
from planweave.engine.protocols import Closable, PlanSeal
from planweave.engine.sink import RunSink
from planweave.engine.speculative import Speculator, resolve_policy
from planweave.journal.base import Journal, NullJournal, ReplyWritten, append_reply, canonical_output

if TYPE_CHECKING:
    from planweave.limits import LimitsRecord

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_MAX_OUTPUT_BYTES", "Engine", "EventListener", "Run", "RunHost", "RunResult",
           "cancel_at_deadline", "check_value", "mark_done", "process_alive", "request_cancel", "send_approval",
           "send_input"]

#: The default bound on a step's encoded output (``Engine(max_output_bytes=...)``).
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
DEFAULT_CONCURRENCY = 64
"""Most steps an engine runs at once when its caller says nothing (``concurrency=None`` means unlimited)."""


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


class Run:
    """One execution of a plan inside an :class:`Engine`: a handle to wait for it (:meth:`wait`), stop it
    (:meth:`cancel`, :meth:`fail`), answer the people it asks (:meth:`approve`, :meth:`send`), change its plan while it
    runs (:meth:`extend`, :meth:`propose`) and follow it (:meth:`events`, :attr:`outputs`, :attr:`status`).

    Behind the handle, engine-internal collaborators with one role each: its emission (the only place its state
    changes), lifecycle (its task, holds and end), attempts (each step's attempts and their outcome), people
    (approvals, inputs, replies), plan changes, speculation hooks and the step sink its tools report to.
    """

    def __init__(self, host: RunHost, run_id: str, tools: ToolCatalog, state: RunState, *, holds: int = 0,
                 speculation: SpeculationSpec | None = None, predictor: Predictor | None = None,
                 priority: float = 0.0) -> None:
        """A run of ``state``'s plan with ``tools``; ``holds`` keeps it open until as many :meth:`release` calls;
        ``speculation`` (not ``off``) starts steps on predicted inputs (docs/speculation.md); ``priority`` orders its
        model calls at shared endpoints (higher first)."""
        self.id = run_id
        self.state = state
        self.outputs: dict[str, Any] = {}
        self.priority = priority  # the run's priority for shared resources (model calls queue by it): higher first
        self._journal = host.journal
        host.journal.track(run_id, state, host.redact)  # the run's summary: from this state, once per batch
        emission = self._emission = Emission(run_id, state, host)
        life = self.lifecycle = Lifecycle(run_id, host, emission, self.outputs, holds)
        attempts = self.attempts = Attempts(run_id, host, tools, emission, life, self.outputs, priority)
        people = self.people = People(run_id, host, emission, life, attempts, self.outputs)
        sink = self.sink = RunSink(host, emission, attempts, people)
        self.changes = PlanChanges(run_id, host, tools, emission, life, attempts)
        self.speculation = SpeculationHooks(run_id, host, emission, life, attempts, sink, self.outputs)
        life.attempts, life.people = attempts, people
        attempts.people, attempts.sink = people, sink
        if speculation is not None and speculation.mode != "off":
            attempts.speculating(Speculator(self.speculation, speculation, host.dispatch, tools, host.clock,
                                            host.max_output_bytes, predictor, journal=host.journal))

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.status}>"

    @property
    def plan(self) -> Plan:
        """The current plan version."""
        return self.state.plan

    @property
    def finished(self) -> bool:
        """Whether the run has ended (:meth:`wait` returns at once)."""
        return self.lifecycle.result.done()

    @property
    def status(self) -> RunStatus:
        """The run's status now: ``running`` until it ends, then how it ended."""
        result = self.lifecycle.result
        if result.done() and not result.cancelled() and result.exception() is None:
            return result.result().status
        return self.state.status

    @property
    def position(self) -> int:
        """How many events the run's state has seen: what a re-planner records as the state it looked at."""
        return self.state.events_applied

    async def wait(self) -> RunResult:
        """Wait for the run to end; raise RunError if it was interrupted (the engine closed) instead."""
        return await asyncio.shield(self.lifecycle.result)

    def cancel(self, reason: str = "cancelled by user") -> None:
        """Stop the run: every in-flight step is cancelled promptly and the journal records it.

        Synchronous (it only asks; await :meth:`wait` for the end): event listeners, deadline watchers and the
        control watcher cancel from callbacks that cannot await.
        """
        self.lifecycle.cancel(reason)

    def fail(self, reason: str) -> None:
        """End the run ``failed`` with error ``reason`` now: a decision (a person aborted, no model to plan with).

        Like :meth:`cancel`, every in-flight step is cancelled promptly and nothing new starts (journaled as
        ``run_cancelled`` with ``status: failed``). Unlike ``on_failure: stop``, the decision is final: the
        cancelled steps are not resumable and :meth:`Engine.resume` refuses the run. Synchronous, as :meth:`cancel`.
        """
        self.lifecycle.cancel(reason, failed=True)

    def cancel_step(self, sid: str, reason: str) -> bool:
        """Cancel step ``sid`` alone, for good (deadline pressure dropping an optional step): journaled as
        ``step_cancelled`` with ``reason``, its attempt stopped, its pending dependents skipped; the run goes on.
        Returns False when the step had finished already (nothing to cancel); raises RunError for an unknown step."""
        return self.attempts.cancel_step(sid, reason)

    def subscribe(self, listener: EventListener) -> None:
        """Call ``listener`` with every event this run emits from now on."""
        self._emission.listeners.append(listener)

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

        listeners = self._emission.listeners
        listeners.append(woken)
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
                await asyncio.wait((waiting, self.lifecycle.result), return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
        finally:
            listeners.remove(woken)

    # -- people in the run ------------------------------------------------------------------------------------
    async def approve(self, step: str, approve: bool = True, reason: str | None = None, *,
                      by: str | None = None) -> None:
        """Answer step ``step``'s request for approval: approved, it runs; rejected, it fails with kind ``rejected``.
        Returns once the answer is journaled durably.

        A rejection is never retried; it runs the step's fallback if it has one, else it is a final failure. The
        first reply is final: :class:`ReplyRefused` (a :class:`RunError`) names the one that stands if the step
        already has one. Raises :class:`RunError` if the run is over, has no such step, or the step is not waiting
        for an approval. ``by``: who answers, for the journal and for the message refusing a later reply.
        """
        self.people.decide(step, approve, reason, by, None)
        await self._journal.flush()

    async def send(self, step: str, value: Any, *, by: str | None = None) -> None:
        """Give ``value`` to step ``step`` (a ``human.input`` call waiting for it): it becomes the step's output.
        Returns once the value is journaled durably.

        Raises :class:`InputRejected` (the step keeps waiting) if the value fails the step's JSON schema,
        :class:`ReplyRefused` naming the value that stands if the step already had one (the first reply is final),
        and :class:`RunError` if the run is over, has no such step, or the step is not waiting for a value.
        """
        self.people.give(step, value, by, None)
        await self._journal.flush()

    # -- changing the plan while it runs ------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the run open while the block runs (a planner is still writing), even if no step is active."""
        self.lifecycle.holds += 1
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        """Give back one hold (from :meth:`hold`, or ``Engine.start``/``Engine.resume`` with ``hold=True``).

        Raises :class:`RunError` if the run holds none: a hold is not journaled, so a run resumed without
        ``hold=True`` has none, and counting below zero would keep it open for ever.
        """
        self.lifecycle.release()

    def extend(self, steps: Sequence[Step | Mapping[str, Any]], *, version: int | None = None,
               **meta: Any) -> list[str]:
        """Add steps to the running plan (streaming admission); they start as soon as their inputs exist.

        Raises :class:`PlanInvalid` naming every problem (nothing is added then). ``meta`` (e.g. ``trigger``,
        ``model_started_at``, ``model_finished_at``) is recorded on the plan version.
        """
        return self.changes.extend(steps, version, meta)

    def propose(self, proposal: PlanSpec | Mapping[str, Any], *, trigger: str = "replan", seen: int | None = None,
                max_staleness: int | None = None, **meta: Any) -> SpliceDiff:
        """Splice a proposed remaining plan in as the next version, matched against the state *now*.

        Finished steps it restates or refers to keep their results; running ones it restates are adopted; steps it
        leaves out are cancelled (running) or dropped (waiting). Raises :class:`StaleProposal` when it depends on
        steps that died since ``seen`` (a :attr:`position`) or when more than ``max_staleness`` events happened
        since then, and :class:`PlanInvalid` when it is invalid. Returns the diff, which is also journaled.
        """
        return self.changes.propose(proposal, trigger, seen, max_staleness, meta)

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None:
        """Journal an event about the run that is not a step transition (``model_call``, ``escalation``,
        ``answer``, ``allocation``, ``forecast``): the planning loop, the allocator and the forecast report through
        this."""
        self._emission.record(kind, data, step)


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
        run.sink.warn_blocked(sid, {"tool": tool, "where": at}, since, lambda: run.finished)

    def _blocking_step(self, task: asyncio.Task[object] | None, frame: FrameType | None) -> tuple[Run, str] | None:
        """The (run, step) whose tool is running in ``frame``, if ``task`` is a step attempt of this engine.

        The innermost Python frame decides: in planweave's own code (bar the built-in tools) it is the engine's work,
        not the tool's. Not a walk up to the attempt's frame: a compiled engine (setup.py) has no Python frames.
        """
        if frame is None or _own_code(frame.f_code.co_filename):
            return None  # not inside a tool call: the engine's own work (or none of ours) blocked the loop
        for run in list(self._runs.values()):
            sid = run.attempts.step_of(task)
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
            run.lifecycle.interrupt()  # not cancel: the journal keeps the run resumable
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
            run.lifecycle.interrupt()

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
        ``limits`` (:meth:`RunLimits.journaled <planweave.limits.RunLimits.journaled>`: budget, deadline,
        model...) is journaled in ``run_created`` as ``options.limits``, for the edges that enforce them to apply them
        again on resume (:class:`planweave.limits.JournaledLimits`).
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
        run = Run(self._host, run_id, catalog, state, holds=int(hold), speculation=policy, predictor=predictor,
                  priority=priority)
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
            await run.lifecycle.begin("run_created", {
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
                  speculation=resolve_policy(state.plan.spec, speculation), predictor=predictor,
                  priority=_journaled_priority(events))
        if on_event is not None:
            run.subscribe(on_event)
        for rec in state.records.values():
            if rec.status == "succeeded" and rec.output_ref is not None:
                if rec.output_ref not in blobs:
                    raise JournalError(f"run '{run_id}': the output of step '{rec.id}' is missing from the journal")
                run.outputs[rec.id] = blobs[rec.output_ref]
        self._runs[run_id] = run
        self.collector.run_started(len(state.plan.steps))
        await run.lifecycle.begin("run_resumed", {"retry_unknown": retry_unknown, "owner": _owner()})
        return run


_log = logging.getLogger("planweave.engine")



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


def _apply_control(run: Run, event: Event) -> None:
    """Apply a ``step_reply`` or ``run_cancel_requested`` another process journaled for ``run``."""
    if event.kind == "step_reply":
        # A reply at or before the run's fold point was folded already (a resumed run applied it).
        if event.step is not None and not run.finished and (event.pos or 0) > run.state.last_pos:
            run.people.apply_reply(event.step, event.data, event.pos)
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
        if not run.people.apply_reply(step, written.event.data, written.event.pos):
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


async def mark_done(journal: Journal, run_id: str, step: str, output: Any = None, *, by: str | None = None,
                    redact: Callable[[Any], Any] | None = None) -> None:
    """Record a person's word that step ``step`` of an interrupted run had its effect, with ``output`` (a JSON value,
    None by default) as its output: the step succeeds, and a resume goes on from it without calling its tool again.

    For a non-idempotent step whose outcome is unknown (it was running when its process died: ``resume`` would stop
    short of it, ``resume --retry-unknown`` would repeat its effect). Journaled as ``step_succeeded`` with ``done``
    and ``by`` (who said so; the event's time says when). Raises :class:`RunNotFound`, :class:`RunError` if the run
    ended succeeded or cancelled, a live process runs it, it has no such step, or the step's outcome is not unknown,
    and :class:`OutputNotSerialisable` if ``output`` is no JSON value. ``redact`` (the engine's, :attr:`Engine.redact`)
    rewrites the output as a tool's is before it is journaled: a secret a person pastes is hidden like a tool's.
    """
    events = await journal.read(run_id)
    if not events:
        raise RunNotFound(f"no run '{run_id}' in the journal {journal.url}")
    state = RunState.from_events(run_id, events)
    if state.status in ("succeeded", "cancelled"):
        raise RunError(f"run '{run_id}' already ended: {state.status}; there is no step to mark done")
    owner = _owner_of(events)
    if state.status == "running" and process_alive(owner):
        raise RunError(f"run '{run_id}' is running (process {owner.get('pid')} on {owner.get('host')}): a step is "
                       "marked done only while no process runs its run")
    rec = state.records.get(step)
    if rec is None:
        raise RunError(f"run '{run_id}' has no step '{step}'{did_you_mean(step, state.records)}")
    if not (rec.status == "unknown" or (rec.status in ("running", "waiting_input") and step not in state.idempotent)):
        raise RunError(f"step '{step}' of run '{run_id}' is {rec.status}, not of unknown outcome: only a "
                       "non-idempotent step that was running when its run was interrupted can be marked done")
    ref = journal.put_blob(canonical_output(output if redact is None else redact(output), step=step, limit=None))
    journal.append(Event(run_id, "step_succeeded", RealClock().now(), step,
                         {"attempt": rec.attempts, "output": ref, "done": True, "by": by}))
    await journal.flush()


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
