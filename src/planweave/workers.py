"""Workers: processes that share one PostgreSQL journal and run the runs submitted to its queue, under leases.

A :class:`Worker` claims queued runs (or runs whose lease expired: their worker died or stalled) up to its
``max_runs``, renews its leases every ``renew_s``, and runs each run in its engine: a run claimed for the first time
is started from its queued plan, one taken over is resumed (finished steps are never run again). Its journal carries
a :class:`~planweave.journal.leases.Fence`, so once a lease is lost (not renewed in time, taken over) nothing more of
that run is written by this worker, and the run is stopped here. A worker stopping cleanly hands its runs back to
the queue, where another claims them at once.

Cancellations, approvals and input reach a run wherever it runs: they are journaled (``run_cancel_requested``,
``step_reply``) and the engine's control watcher of the worker holding the run applies them; a run taken over
applies the replies journaled before when it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from planweave.core.errors import JournalError, PlanweaveError, RunError, RunNotFound
from planweave.core.events import Event
from planweave.core.plan.catalog import ToolCatalog
from planweave.engine.runtime import Engine, Run, cancel_at_deadline
from planweave.journal.leases import DEFAULT_LEASE_S, Claim, Fence, LeaseStore
from planweave.journal.postgres import PostgresJournal
from planweave.limits import JournaledLimits, RunLimits

if TYPE_CHECKING:
    from planweave.allocate import AllocationSeam
    from planweave.models import Budget

#: The catalog a run's steps get, given the model its ``llm`` steps call (None: it names none), its budget and the
#: allocator of its ``model: auto`` steps (None: it was queued without tiers).
RunTools = Callable[[str | None, "Budget | None", "AllocationSeam | None"], Awaitable[ToolCatalog | None]]

__all__ = ["DEFAULT_MAX_RUNS", "Worker", "WorkerOptions", "WorkerTally", "cancel_queued", "default_worker_name",
           "refuse_if_queued"]

#: Runs a worker holds at once unless told otherwise (``planweave worker --max-runs``).
DEFAULT_MAX_RUNS = 16


async def cancel_queued(url: str, run_id: str, reason: str = "cancelled by user") -> None:
    """Cancel a run still waiting in the queue of the PostgreSQL journal at ``url`` (no worker claimed it).

    Raises RunNotFound if it was never queued, RunError if a worker holds it (cancel it again: its engine applies
    it) or it ended.
    """
    store = await LeaseStore.open(url)
    try:
        if await store.cancel_queued(run_id, reason):
            return
        lease = await store.state(run_id)
    except RunNotFound:
        raise RunNotFound(f"no run '{run_id}' in the journal {store.url} (nor in its queue)") from None
    finally:
        await store.close()
    if lease.state == "done":
        raise RunError(f"run '{run_id}' already ended: {lease.outcome}")
    raise RunError(f"run '{run_id}' was just claimed by worker {lease.holder}: cancel it again (that worker's engine "
                   "applies it)")


async def refuse_if_queued(url: str, run_id: str) -> None:
    """Raise RunError if ``run_id`` belongs to the workers' queue and has not ended there: a ``planweave resume``
    by hand would run it beside the worker holding it, unfenced."""
    from planweave.journal.leases import queued_state

    lease = await queued_state(url, run_id)
    if lease is None or lease.state == "done":
        return
    holder = f"worker {lease.holder} holds it" if lease.state == "running" else "it waits in the queue"
    raise RunError(f"run '{run_id}' was submitted to the workers and {holder}: a worker resumes it (planweave "
                   "workers shows which); cancel it with planweave cancel")


def default_worker_name() -> str:
    """``host-pid``: unique among the processes sharing a journal."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker claims and keeps runs: its name, how many runs at once, the lease and how often it renews.

    ``renew_s`` defaults to a third of ``lease_s``, so two renewals may be late before the lease is lost;
    ``poll_s`` bounds the sleep between claims when no notification arrives (expired leases are noticed at their
    expiry time anyway).
    """

    name: str
    max_runs: int = DEFAULT_MAX_RUNS
    lease_s: float = DEFAULT_LEASE_S
    renew_s: float | None = None
    poll_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_runs < 1:
            raise ValueError(f"worker '{self.name}': max_runs must be at least 1, got {self.max_runs}")
        if not 0 < self.lease_s <= 3600:
            raise ValueError(f"worker '{self.name}': the lease must be between 0 and 3600 s, got {self.lease_s}")
        if self.renew_s is not None and self.renew_s <= 0:
            raise ValueError(f"worker '{self.name}': renew_s must be positive, got {self.renew_s}")

    @property
    def renew_every(self) -> float:
        return self.renew_s if self.renew_s is not None else self.lease_s / 3


@dataclass
class WorkerTally:
    """What a worker did: runs claimed (of which taken over from another worker), finished by outcome, lost."""

    claimed: int = 0
    taken_over: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    handed_back: int = 0
    refused_events: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"claimed": self.claimed, "taken_over": self.taken_over, "finished": dict(self.finished),
                "lost": self.lost, "handed_back": self.handed_back, "refused_events": self.refused_events}


class Worker:
    """Claims, runs and renews runs of one queue until :meth:`stop` (see the module docstring).

    The caller owns ``engine`` (open, on ``journal``), ``journal`` and ``store``; :meth:`serve` sets the journal's
    fence. ``log`` receives one line per claim, end, loss and hand-back.

    Secrets: ``engine``'s ``redact`` (a :class:`~planweave.tools.safety.SecretRedactor`, as ``planweave run``
    gives its engine) also hides them in what the worker writes to the queue (errors) and logs; its seal puts back
    the secrets ``submit`` sealed in the queued plan (:meth:`~planweave.journal.leases.QueuedRun.sealed`).

    A queued run's limits (``options.limits`` of its queue row: budget and deadline, as ``planweave submit`` gives
    them) and the model its ``llm`` steps call (``options.model``) are applied as ``planweave run`` applies them:
    ``run_tools`` gives the run its catalog (``llm`` bound to that model within that budget), the deadline counts
    from the start and is journaled, so a worker that takes the run over keeps the same end and what is left of the
    budget. Without ``run_tools`` a run naming a model fails at start, saying so.
    """

    def __init__(self, engine: Engine, journal: PostgresJournal, store: LeaseStore, options: WorkerOptions, *,
                 tools: ToolCatalog | None = None, log: Callable[[str], None] = lambda line: None,
                 run_tools: RunTools | None = None) -> None:
        if engine.journal is not journal:
            raise ValueError(f"worker '{options.name}': the engine must write to the worker's journal")
        self.engine = engine
        self.journal = journal
        self.store = store
        self.options = options
        self.tools = tools
        self.run_tools = run_tools
        self.tally = WorkerTally()
        self.fence = Fence(options.name, self._refused)
        # What the engine keeps out of the journal stays out of the queue and the log too (errors name values).
        self._hide: Callable[[Any], Any] = engine.redact or _same
        self._print = log
        self._wake = asyncio.Event()
        self._stopping = False
        self._claims: dict[str, Claim] = {}  # held now
        self._ending: set[str] = set()  # runs whose outcome is known: a renewal that misses them is no loss
        self._lost: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._journal_lost: JournalError | None = None

    @property
    def name(self) -> str:
        return self.options.name

    def _log(self, line: str) -> None:
        self._print(self._hide(line))

    @property
    def holding(self) -> Mapping[str, int]:
        """The runs this worker holds now, with their lease epochs."""
        return {rid: c.epoch for rid, c in self._claims.items()}

    def stop(self) -> None:
        """Stop claiming; the runs held are interrupted and handed back to the queue (callable from a signal)."""
        self._stopping = True
        self._wake.set()

    async def serve(self) -> WorkerTally:
        """Work until :meth:`stop`; raises JournalError if the journal fails (the leases then expire elsewhere)."""
        await self.journal.set_fence(self.fence, self.options.lease_s)
        await self.store.register(self.name, self.options.lease_s)
        self._log(f"worker {self.name}: claiming runs of {self.store.url} (lease {self.options.lease_s:g}s, "
                  f"at most {self.options.max_runs} at once)")
        helpers = [asyncio.create_task(self._renew_loop(), name=f"planweave-worker-renew {self.name}"),
                   asyncio.create_task(self.store.listen(self._wake), name=f"planweave-worker-listen {self.name}")]
        try:
            await self._claim_loop(helpers)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._hand_back()
        if self._journal_lost is not None:
            raise self._journal_lost
        self.tally.refused_events = self.fence.refused_events
        return self.tally

    # -- claiming ---------------------------------------------------------------------------------------------------
    async def _claim_loop(self, helpers: list[asyncio.Task[Any]]) -> None:
        opts = self.options
        while not self._stopping:
            for task in helpers:  # a failed renewal or listener ends the worker, visibly
                failure = task.exception() if task.done() and not task.cancelled() else None
                if failure is not None:
                    raise failure
            if self._journal_lost is not None:  # stop claiming, exit: the leases expire for other workers
                raise self._journal_lost
            self._wake.clear()
            free = opts.max_runs - len(self._claims)
            claims = await self.store.claim(self.name, free, opts.lease_s)
            for claim in claims:
                self._start(claim)
            if self._stopping:
                break
            delay = opts.poll_s
            if len(claims) < free:  # the queue is drained: wake at the next lease expiry too
                expiry = await self.store.next_expiry()
                if expiry is not None:
                    delay = min(delay, max(expiry, 0.0) + 0.05)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _start(self, claim: Claim) -> None:
        self.fence.hold(claim.run_id, claim.epoch)
        self._claims[claim.run_id] = claim
        self.tally.claimed += 1
        if claim.previous is not None:
            self.tally.taken_over += 1
            self._log(f"worker {self.name}: took over run {claim.run_id} from {claim.previous} (epoch {claim.epoch})")
        else:
            self._log(f"worker {self.name}: claimed run {claim.run_id} (epoch {claim.epoch})")
        task = asyncio.create_task(self._drive(claim), name=f"planweave-worker-run {claim.run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, claim: Claim) -> None:
        rid = claim.run_id
        keep = False  # stopping: the claim stays held until it is handed back
        try:
            try:
                outcome, error = await self._run(claim)
            except RunError as exc:
                if rid in self._lost or self._stopping:
                    keep = self._stopping and rid not in self._lost
                    return  # lost: logged where noticed; stopping: handed back
                if await self._journal_failed():
                    keep = True
                    return  # the run stopped because the journal cannot be written: the worker stops
                outcome, error = "error", str(exc)
            except PlanweaveError as exc:  # e.g. the plan needs tools this worker lacks: say so in the queue
                outcome, error = "error", str(exc)
            self._ending.add(rid)
            error = None if error is None else self._hide(error)
            if await self.store.finish(claim, self.name, outcome, error):
                self.tally.finished[outcome] = self.tally.finished.get(outcome, 0) + 1
                detail = f": {error}" if error else ""
                self._log(f"worker {self.name}: run {rid} {outcome}{detail}")
        finally:
            self._ending.discard(rid)
            if not keep:
                self.fence.drop(rid, claim.epoch)
                if self._claims.get(rid) is claim:
                    del self._claims[rid]
            self._lost.discard(rid)
            self._wake.set()  # a slot is free

    async def _journal_failed(self) -> bool:
        try:
            await self.journal.flush()
        except JournalError as exc:
            if self._journal_lost is None:
                self._journal_lost = exc
                self._log(f"worker {self.name}: the journal cannot be written ({exc}); stopping")
            self.stop()
            return True
        return False

    async def _run(self, claim: Claim) -> tuple[str, str | None]:
        """Start the claimed run, or resume it if an earlier holder began it; its outcome."""
        rid = claim.run_id
        # Epoch 1: nobody held the run before, so it has no events (submit refuses an id the journal has).
        events = [] if claim.epoch == 1 else await self.journal.read(rid)
        ended = _outcome(events)
        if ended is not None:
            return ended, None  # the last holder finished it but died before saying so in the queue
        options = claim.run.options
        try:
            if not events:
                run = await self._begin(claim)
            else:
                recorded = JournaledLimits.from_events(events)
                seam = self._allocation(rid, recorded.tiers, recorded.deadline_at, "its journaled tiers")
                tools = await self._tools_for(rid, recorded.model, recorded.budget(), seam)
                run = await self.engine.resume(rid, tools=tools, retry_unknown=bool(options.get("retry_unknown")))
                recorded.apply_deadline(self.engine, run)
                from planweave.allocate.pressure_watch import forecast_and_watch

                forecast_and_watch(self.engine, run, deadline_at=recorded.deadline_at,
                                   budget_usd=recorded.limits.budget_usd, threshold=recorded.pressure, seam=seam)
        except RunError:
            # Ended meanwhile from outside (`planweave cancel` of a run whose worker had died): that is its outcome.
            ended = _outcome(await self.journal.read(rid))
            if ended is None:
                raise
            return ended, None
        if self._claims.get(rid) is not claim or self._stopping:
            self.engine.interrupt(rid)  # lost, or the worker began stopping, while the run was being started
        result = await run.wait()
        return result.status, result.error

    async def _begin(self, claim: Claim) -> Run:
        """Start a run claimed for the first time, within the limits it was queued with."""
        options = claim.run.options
        queued = options.get("limits") or {}
        limits = RunLimits(**{f.name: queued.get(f.name) for f in fields(RunLimits)})
        model = options.get("model")
        now = self.engine.clock.now()
        tiers = options.get("tiers")
        seam = self._allocation(claim.run_id, tiers, None if limits.deadline is None else now + limits.deadline,
                                "its queued tiers")
        tools = await self._tools_for(claim.run_id, model, limits.budget(), seam)
        journaled = limits.journaled(now, model, tiers=tiers) if queued or model else None
        plan = claim.run.unsealed_plan(self.engine.seal)  # sealed by submit; the engine seals what it journals
        run = await self.engine.start(plan, tools=tools, run_id=claim.run_id, source=claim.run.source,
                                      on_failure=options.get("on_failure"), limits=journaled,
                                      priority=float(options.get("priority") or 0.0))
        if limits.deadline is not None:
            cancel_at_deadline(self.engine, run, limits.deadline)
        # Its live forecast (queued with a deadline or a dollar budget) and the plan's deadline pressure.
        from planweave.allocate.pressure_watch import forecast_and_watch

        forecast_and_watch(self.engine, run, deadline_at=None if limits.deadline is None else now + limits.deadline,
                           budget_usd=limits.budget_usd, seam=seam)
        return run

    def _allocation(self, run_id: str, tiers: Any, deadline_at: float | None, what: str) -> AllocationSeam | None:
        """The allocator of a run's ``model: auto`` steps on its tier table (None without one), reading this
        worker's engine; raises RunError naming the run when the table does not read."""
        if tiers is None:
            return None
        from planweave.allocate import AllocationError, AllocationSeam, TierTable

        try:
            table = TierTable.from_mapping(tiers, where=f"run '{run_id}': {what}")
        except AllocationError as exc:
            raise RunError(str(exc)) from None
        from planweave.forecast.history import read_estimates

        journal = self.engine.journal  # the tiers fitted from its history, read at the run's first decision
        seam = AllocationSeam(table, deadline_at=deadline_at, history=lambda: read_estimates(journal))
        seam.bind(self.engine.get)
        return seam

    async def _tools_for(self, run_id: str, model: str | None, budget: Budget | None,
                         allocation: AllocationSeam | None = None) -> ToolCatalog | None:
        if self.run_tools is not None:
            return await self.run_tools(model, budget, allocation)
        if model is not None:
            raise RunError(f"run '{run_id}' calls model '{model}' in its llm steps, and worker {self.name} has no "
                           "model client to give it")
        return self.tools

    # -- keeping leases ---------------------------------------------------------------------------------------------
    async def _renew_loop(self) -> None:
        opts = self.options
        while True:
            await asyncio.sleep(opts.renew_every)
            held = self.holding
            kept = await self.store.renew(self.name, held, opts.lease_s)
            for rid, epoch in held.items():
                claim = self._claims.get(rid)
                if rid not in kept and claim is not None and claim.epoch == epoch:
                    self._lose(rid, "it was not renewed in time and another worker may have taken it over")

    def _refused(self, run_id: str, epoch: int) -> None:
        claim = self._claims.get(run_id)
        if claim is not None and claim.epoch == epoch:
            self._lose(run_id, "the journal refused its events (another worker holds a newer epoch)")

    def _lose(self, run_id: str, why: str) -> None:
        claim = self._claims.get(run_id)
        if claim is None or run_id in self._lost or run_id in self._ending:
            return
        self._lost.add(run_id)
        del self._claims[run_id]
        self.fence.drop(run_id, claim.epoch)
        self.tally.lost += 1
        self.engine.interrupt(run_id)
        self._log(f"worker {self.name}: lost the lease of run {run_id} (epoch {claim.epoch}): {why}; "
                  "stopped it here")

    async def _hand_back(self) -> None:
        """Stop the runs still held and return them to the queue once what they wrote is stored."""
        held = list(self._claims.values())
        for claim in held:
            self.engine.interrupt(claim.run_id)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        try:
            await self.journal.flush()
        finally:
            await self.store.release(held, self.name)
            self.tally.handed_back += len(held)
            for claim in held:
                self._log(f"worker {self.name}: handed run {claim.run_id} back to the queue")
            self._claims.clear()
            await self.store.retire(self.name)


def _same(value: Any) -> Any:
    return value


def _outcome(events: Sequence[Event]) -> str | None:
    """The status of the last ``run_finished`` not followed by a ``run_resumed`` (None: the run has not ended)."""
    ended: str | None = None
    for event in events:
        if event.kind == "run_finished":
            ended = str(event.data.get("status"))
        elif event.kind == "run_resumed":
            ended = None
    return ended
