"""A run's attempts: each ready step queued, admitted, executed (:mod:`planweave.engine.attempt`), and its outcome
settled in one place (:meth:`Attempts.settle`: the step's own attempt and an adopted speculative one alike); retries,
fallbacks, ``on_failure: stop``, and the tasks the run waits for before it ends.

A run keeps its attempts' tasks itself rather than in its TaskGroup: the group's done-callback is a second loop
callback per step (-8.6 % of a no-op step's instructions, layered DAG; docs/benchmarks.md, "The engine at the floor").
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planweave.core.context import StepContext, StepSink
from planweave.core.errors import EventNotRecorded, JournalError, RunError
from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.core.plan.model import TERMINAL_STATUSES, Claim, Step
from planweave.core.state import ACTIVE, StepRecord
from planweave.engine import attempt as _attempt
from planweave.engine.attempt import FALLBACK, Retry, Watchdogs
from planweave.engine.cache import CacheEntry, StepCache
from planweave.engine.emission import Emission
from planweave.engine.executor import ToolCall
from planweave.engine.host import RunHost
from planweave.engine.lifecycle import Lifecycle

if TYPE_CHECKING:
    from planweave.engine.people import People
    from planweave.engine.speculative import Speculator

_new_tuple = tuple.__new__  # a NamedTuple of every field, without the Python-level call of its __new__
_STARTED = {n: {"attempt": n} for n in (1, 2, 3)}


class Attempts:
    """The attempts of one run's steps, from the ready queue to their settled outcome."""

    def __init__(self, run_id: str, host: RunHost, tools: ToolCatalog, emission: Emission, life: Lifecycle,
                 outputs: dict[str, Any], priority: float) -> None:
        self.run_id = run_id
        self.state = emission.state
        self.outputs = outputs
        self.priority = priority  # the run's, for shared resources (a step's model calls queue by it)
        self.tools = tools
        self._host = host
        self._emit, self._emit_step = emission.emit, emission.emit_step
        self._life = life
        dispatch = host.dispatch
        self._enqueue, self._give_back, self._pump = dispatch.enqueue, dispatch.release, dispatch.pump
        self.tasks: dict[str, asyncio.Task[None]] = {}  # per step: its attempt's task (see launch)
        self._cancelled: set[asyncio.Task[None]] = set()  # attempts cancelled, not ended yet: the run waits for them
        self._closing = False  # the run is ending: no attempt starts any more
        self.timers: dict[str, asyncio.Task[None]] = {}  # per step: a retry delay or the deadline of an approval
        self.watchdogs: Watchdogs = {}
        self._loop = asyncio.get_running_loop()
        # Each attempt's task runs in a copy of the context the run was created in, not of whichever task launched
        # it: a step admitted while the planner's model call is streaming (inside its call context) must not
        # inherit that call's class (run, purpose, priority), nor another run's.
        self._context = contextvars.copy_context()
        self._durable = host.journal.durable
        self.cache = StepCache(host.journal, host.clock.now, lookup=host.cache, redact=host.redact)
        self._caching = StepCache.declared_in(tools)  # else only a step saying cache: may be cached
        self.spec: Speculator | None = None  # speculative attempts (None: speculation off, nothing to pay)
        emission.on_ready = self.enqueue_ready
        # Wired by the run once they exist.
        self.people: People
        self.sink: StepSink

    def speculating(self, spec: Speculator) -> None:
        """Speculate with ``spec``: it looks for work whenever a slot is given back."""
        self.spec = spec
        self._give_back = self._release_and_speculate

    def _release_and_speculate(self, claims: Claim | None) -> None:
        """The dispatcher's release, then a look for speculative work (a slot is free, an output may be new)."""
        self._host.dispatch.release(claims)
        if self.spec is not None:
            self.spec.schedule()

    def speculate(self) -> None:
        """Look for speculative work (after a change that may have made some possible)."""
        if self.spec is not None:
            self.spec.schedule()

    def enqueue_ready(self, ready: Sequence[str], now: float) -> None:
        """Steps an event made ready at ``now``: each waits for approval, is its speculative attempt, or is queued."""
        enqueue = self._enqueue
        state = self.state
        approvals = state.approvals
        spec = self.spec
        left = len(ready)
        for sid in ready:
            if approvals and sid in approvals and state.needs_approval(sid):
                self.people.request_approval(sid)
            elif spec is not None and sid in spec.attempts and spec.resolve(state.records[sid]):
                pass  # its speculative attempt, on the real arguments, is its attempt
            else:
                enqueue(self, sid, now, left)
            left -= 1

    def launch(self, rec: StepRecord, claims: Claim | None) -> None:
        """Start an attempt of step ``rec``, admitted with ``claims`` (the dispatcher calls this)."""
        sid = rec.id
        if self._life.tg is None or self.state.records.get(sid) is not rec or rec.status != "ready":
            self._give_back(claims)  # stale queue entry: cancelled, replaced by a new version, or a duplicate
            return
        if self._closing:
            # The run is being cancelled or interrupted and an admission arrived meanwhile: the step stays ready
            # (a resume runs it).
            self._give_back(claims)
            return
        attempt = rec.attempts + 1
        # Not in the run's TaskGroup: the run waits for its attempts itself (join). Named by its step: an unnamed
        # task formats "Task-N" for itself, ~1.5 % of a no-op step, and a step's id says more in a debugger or a
        # stack dump. Built as loop.create_task builds it when no task factory is set, without its Python frame
        # (~2 %; docs/benchmarks.md, "the fields of a step").
        loop = self._loop
        coro = self._execute(rec, attempt, claims)
        context = self._context.copy()
        task = (asyncio.Task(coro, loop=loop, name=sid, context=context) if loop.get_task_factory() is None
                else loop.create_task(coro, name=sid, context=context))
        # Emitted before the task first runs, so no second launch can see it ready. Event data is never mutated:
        # shared dicts are safe.
        self._emit_step("step_started", sid, _STARTED[attempt] if attempt < 4 else {"attempt": attempt})
        self.tasks[sid] = task

    async def _execute(self, rec: StepRecord, attempt: int, claims: Claim | None) -> None:
        """One attempt of a step (:mod:`planweave.engine.attempt`), from its write-ahead record to its outcome."""
        plan = self.state.plan
        sid = rec.id
        fields = plan.values[sid]  # the step's fields without pydantic's attribute hook (Plan.values)
        host = self._host
        try:
            try:
                if self._durable and sid not in self.state.idempotent:
                    # Write-ahead: a non-idempotent step's start is durable before it can have effects.
                    await host.journal.flush()
                tool, args = _attempt.prepare(plan, rec, self.outputs, self.tools)
                cached = self.cache.entry(plan, rec, tool, args) if self._caching or fields["cache"] else None
                if cached is not None and (hit := await self.cache.lookup(cached)) is not None:
                    # a hit: the tool is not called (docs/caching.md)
                    self.settle(rec, attempt, hit.value, journaled={"attempt": attempt, "output": hit.ref,
                                                                    "cache": hit.source})
                    return
                # Built as tuples directly, not through the NamedTuples' Python __new__ (as emission builds events).
                context = _new_tuple(StepContext, (self.run_id, sid, attempt, host.clock, self.sink,
                                                   fields["isolation"], fields["executor"], fields["resources"],
                                                   self.priority, plan.slack[sid]))
                call: ToolCall = _new_tuple(ToolCall, (tool, args, context))
                if fields["timeout"] is None and fields["heartbeat"] is None:
                    output = await host.executor.execute(call)
                else:
                    output = await _attempt.guarded(host.executor, call, plan.steps[sid], self.watchdogs)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the run is cancelled, the step was spliced out, or the engine is closing
                self.settle(rec, attempt, None, RuntimeError(f"tool raised CancelledError: {exc}"))
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                # SystemExit and KeyboardInterrupt too: raised in a task they would escape the loop and end the
                # process. A real Ctrl-C never arrives here: the CLI turns SIGINT into a cancellation of its main task.
                self.settle(rec, attempt, None, exc)
            else:
                self.settle(rec, attempt, output, entry=cached if cached is not None or self.spec is None
                            else self.history_entry(sid, tool, args))
            finally:
                self.ended(rec, attempt, claims)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the run's own bookkeeping above failed (an engine bug): the run ends with it
            self._life.crash(exc)

    def settle(self, rec: StepRecord, attempt: int, output: Any, error: BaseException | None = None, *,
               entry: CacheEntry | None = None, journaled: Mapping[str, Any] | None = None) -> None:
        """The one place an attempt's outcome is journaled: ``output`` stored and the step succeeded (indexed under
        the cache ``entry`` if any; ``journaled``: the success of an output stored already, a cache hit), or
        ``error`` (or a failure to store the output) classified and what follows carried out (retry, fallback, give
        up). An outcome that comes after its step was cancelled changes nothing; a write the journal lost stops the
        run."""
        sid = rec.id
        if error is None and journaled is None:
            host = self._host
            try:
                output, ref = _attempt.store_output(output, sid, host.journal, limit=host.max_output_bytes,
                                                    redact=host.redact)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                error = exc
            else:
                journaled = {"attempt": attempt, "output": ref} if entry is None else \
                    self.cache.succeeded(entry, attempt, ref, output)
        if error is None:
            if rec.status != "cancelled":  # else the outcome came too late: the step is over
                self.outputs[sid] = output
                self._emit_step("step_succeeded", sid, journaled)  # type: ignore[arg-type]
            return
        if isinstance(error, JournalError) and not isinstance(error, EventNotRecorded):
            self._life.stop_unrecordable(error)
        elif rec.status != "cancelled" or isinstance(error, EventNotRecorded):
            self.fail(rec, self.state.plan.steps[sid], attempt, error)

    def ended(self, rec: StepRecord, attempt: int, claims: Claim | None, *, slot: bool = True) -> None:
        """An attempt's task is over: give back its slot (``slot``: it held one of the dispatcher's), and end the run
        if nothing is left to do."""
        sid = rec.id
        # The step's entry is this attempt's unless a later attempt (a fallback launched above) or a replacement
        # step (a new plan version: a new record) took it. Not `is asyncio.current_task()`, a Python function in
        # 3.11: with the executor below, ~1% of a no-op step's instructions (docs/benchmarks.md, "Where planweave's
        # time goes").
        if rec.attempts == attempt and self.state.records.get(sid) is rec:
            self.tasks.pop(sid, None)
        if slot:
            self._give_back(claims)
        elif self.spec is not None:
            self.spec.schedule()
        life = self._life
        if not self.state.active and not life.holds:
            life.done.set()

    def history_entry(self, sid: str, tool: ToolSpec, args: Mapping[str, Any]) -> CacheEntry | None:
        """A speculating run indexes the output of an idempotent step a safe consumer references, cacheable or not:
        a later run of the journal may predict from it (docs/speculation.md, "History")."""
        spec = self.spec
        if spec is None or sid not in self.state.idempotent or not spec.predicts_for(sid):
            return None
        return self.cache.history_entry(tool, args)

    def entry_of(self, rec: StepRecord, step: Step, args: Mapping[str, Any]) -> CacheEntry | None:
        """The cache entry an attempt of ``step`` on ``args`` is indexed under, as the step's own attempt's is."""
        tool = self.tools.get(step.tool)
        if tool is None:
            return None
        cached = self.cache.entry(self.state.plan, rec, tool, args) if self._caching or step.cache else None
        return cached if cached is not None else self.history_entry(rec.id, tool, args)

    def fail(self, rec: StepRecord, step: Step, attempt: int, exc: BaseException) -> None:
        """Journal a failed attempt and carry out what :func:`~planweave.engine.attempt.decide` says follows."""
        sid = rec.id
        failure = _attempt.classify(exc, step)
        redact = self._host.redact
        message = failure.message if redact is None else redact(failure.message)
        jitter = random.Random(f"{self.run_id}/{sid}/{attempt}").random()
        decision = _attempt.decide(failure, step, attempt, fallback_active=rec.fallback_active, jitter=jitter)
        if isinstance(decision, Retry):
            self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": failure.kind,
                                            "final": False, "retry_in": decision.delay})
            self.arm(sid, self._retry_after(rec, decision.delay))
        else:
            self.give_up(rec, step, attempt, failure.kind, message)

    def give_up(self, rec: StepRecord, step: Step, attempt: int, kind: str, message: str) -> None:
        """The step failed without a retry left: run its fallback if it has one, else fail it for good."""
        sid = rec.id
        if _attempt.settle(step, fallback_active=rec.fallback_active) == FALLBACK and step.fallback is not None:
            self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": kind, "final": False,
                                            "retry_in": 0.0, "fallback": True})
            self._emit("escalation", sid, {"rung": "fallback", "reason": message, "tool": step.fallback.tool})
            self._enqueue(self, sid, self._host.clock.now())
            return
        self._emit("step_failed", sid, {"attempt": attempt, "error": message, "kind": kind, "final": True})
        if self.state.on_failure == "stop":
            self._stop(sid)

    def _stop(self, root: str) -> None:
        """The run's outcome is decided (``on_failure: stop``): cancel what is in flight, start nothing new.

        The cancellations are journaled as ``resumable``, so a later resume runs those steps again.
        """
        reason = f"the run stopped: step '{root}' failed and nothing can repair it"
        self._host.dispatch.withdraw(self)
        for rec in list(self.state.records.values()):
            if rec.status in ACTIVE:
                self._emit("step_cancelled", rec.id, {"reason": reason, "resumable": True})
                task = self.tasks.pop(rec.id, None)
                if task is not None:
                    self.cancel_attempt(task)
        self.cancel_timers()

    async def _retry_after(self, rec: StepRecord, delay: float) -> None:
        await asyncio.sleep(delay)
        self.timers.pop(rec.id, None)
        if self.state.records.get(rec.id) is rec and rec.status == "ready":
            self._enqueue(self, rec.id, self._host.clock.now())
            self._pump()

    def cancel_step(self, sid: str, reason: str) -> bool:
        """Cancel step ``sid`` alone, for good (see :meth:`planweave.engine.runtime.Run.cancel_step`)."""
        self._life.check_alive()
        rec = self.state.records.get(sid)
        if rec is None:
            raise RunError(f"run '{self.run_id}' has no step '{sid}'")
        if rec.status in TERMINAL_STATUSES:
            return False
        timer = self.timers.pop(sid, None)  # a retry's delay or an approval's deadline
        task = self.tasks.pop(sid, None)
        self._emit("step_cancelled", sid, {"reason": reason})
        if timer is not None:
            timer.cancel()
        if task is not None:
            self.cancel_attempt(task)
        self._life.check_done()
        return True

    # -- timers: a retry's delay, an approval's deadline --------------------------------------------------------
    def arm(self, sid: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the run's TaskGroup as step ``sid``'s timer (cancelled with the step or the run)."""
        tg = self._life.tg
        if tg is None:
            coro.close()
            return
        self.timers[sid] = tg.create_task(coro)

    def disarm(self, sid: str) -> None:
        """Cancel step ``sid``'s timer, if it has one."""
        timer = self.timers.pop(sid, None)
        if timer is not None:
            timer.cancel()

    def cancel_timers(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()

    # -- the tasks the run waits for ------------------------------------------------------------------------------
    def stop_all(self) -> None:
        """The run is ending early (cancelled, interrupted, crashed): start no attempt, cancel those in flight."""
        self._closing = True
        for task in (*self.tasks.values(), *self._cancelled):
            task.cancel()

    async def join(self) -> None:
        """Wait until every attempt task of the run has ended; then no attempt starts any more.

        As in a TaskGroup, a cancellation of the run while it waits cancels the attempts and is raised once they have
        ended.
        """
        cancelled: asyncio.CancelledError | None = None
        while live := [task for task in (*self.tasks.values(), *self._cancelled) if not task.done()]:
            try:
                await asyncio.wait(live)
            except asyncio.CancelledError as exc:
                cancelled = exc
                self.stop_all()
        self._closing = True
        if cancelled is not None:
            raise cancelled

    def cancel_attempt(self, task: asyncio.Task[None]) -> None:
        """Cancel an attempt the run goes on without (its step was cancelled or spliced out); the run still waits
        for its task to end."""
        task.cancel()
        if not task.done():
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)

    def step_of(self, task: asyncio.Task[Any] | None) -> str | None:
        """The step whose attempt ``task`` is, if it is one of this run's."""
        for sid, attempt in list(self.tasks.items()):
            if attempt is task:
                return sid
        return None
