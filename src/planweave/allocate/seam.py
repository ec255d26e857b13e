"""What the ``llm`` tool asks before a ``model: auto`` call: the run's remaining plan, the allocator, the journal.

:class:`AllocationSeam` is bound to the runs it may read (``runs``: ``Engine.get``), the tier table, a deadline and
an :class:`~planweave.allocate.Allocator`. When the tool runs a step with ``model: auto`` it calls
:meth:`AllocationSeam.decide` with the step's context and its allocation arguments; the seam turns the run's plan
and state into a :class:`~planweave.allocate.Problem` (finished steps left out, running steps pinned to what they
were given, the step's retries left), asks the allocator, remembers the choice, and journals an ``allocation``
event through the run. The allocator stays pure; the engine's core knows nothing of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from planweave.allocate.allocator import Allocator, Policy
from planweave.allocate.history import Fitted, fitted_table
from planweave.allocate.model import (
    MAX_SAMPLES,
    SELECTS,
    AllocationError,
    Backoff,
    Choice,
    Decision,
    Problem,
    Select,
    StepOptions,
    TierTable,
)
from planweave.core.context import StepContext
from planweave.core.events import EventKind
from planweave.core.plan.graph import Plan
from planweave.core.plan.model import Step
from planweave.core.state import RunState
from planweave.forecast.estimates import Estimates

DONE = frozenset({"succeeded", "skipped", "cancelled"})
DEFAULT_MAX_SAMPLES = 3
"""``samples: auto`` chooses among 1 .. this many parallel samples unless the step says ``max_samples``."""


class AllocatedRun(Protocol):
    """What the seam reads of a run (``engine.runtime.Run`` is one): its plan, its state, and a way to journal."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> RunState: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class AutoArgs:
    """An ``llm`` step's allocation arguments, checked: the tiers it may use, the sample counts, the select rule."""

    tiers: tuple[str, ...]
    samples: tuple[int, ...]
    select: Select

    @classmethod
    def parse(cls, table: TierTable, args: Mapping[str, Any], *, step: str) -> AutoArgs:
        """Check ``tiers``, ``samples`` (``auto`` or a count), ``max_samples`` and ``select`` of a step's args
        against ``table``; raise :class:`AllocationError` naming the step and the field."""
        where = f"step '{step}'"
        tiers = args.get("tiers")
        if tiers is None:
            tiers = list(table.tiers)
        if not isinstance(tiers, list | tuple) or not tiers or not all(isinstance(t, str) for t in tiers):
            raise AllocationError(f"{where}: 'tiers' must be a non-empty list of tier names, got {tiers!r}")
        for t in tiers:
            if t not in table:
                known = ", ".join(sorted(table.tiers))
                raise AllocationError(f"{where}: 'tiers' names unknown tier '{t}' (known tiers: {known})")
        most = args.get("max_samples")
        if most is None:
            most = DEFAULT_MAX_SAMPLES
        if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_SAMPLES:
            raise AllocationError(f"{where}: 'max_samples' must be a count from 1 to {MAX_SAMPLES}, got {most!r}")
        samples = args.get("samples")
        counts: tuple[int, ...]
        if samples is None:
            counts = (1,)
        elif samples == "auto":
            counts = tuple(range(1, most + 1))
        elif isinstance(samples, int) and not isinstance(samples, bool) and 1 <= samples <= MAX_SAMPLES:
            counts = (samples,)
        else:
            raise AllocationError(f"{where}: 'samples' must be 'auto' or a count from 1 to {MAX_SAMPLES}, "
                                  f"got {samples!r}")
        select = args.get("select") or ("verifier" if args.get("verifier") else "first_valid")
        if select not in SELECTS:
            raise AllocationError(f"{where}: 'select' must be one of {', '.join(SELECTS)}, got {select!r}")
        return cls(tuple(tiers), counts, cast(Select, select))


class AllocationSeam:
    """Decides ``model: auto`` steps of the runs ``runs`` returns (or, bound later, :meth:`bind`'s); see the module
    docstring.

    ``deadline_at`` is the clock time the runs must finish by (None: no deadline); ``policy`` the allocator's policy
    (``monte_carlo``, or a baseline); ``tool`` the name of the ``llm`` tool whose steps are allocated;
    ``step_table`` a step's own tier profiles where they differ from ``table`` (declared, or from estimates);
    ``history`` the estimates of past runs (``forecast.history.read_estimates`` on the journal): read once, before
    the first decision, and combined with ``table`` as the prior (``allocate/history.py``), the allocator decides on
    the fitted profiles.
    """

    def __init__(self, table: TierTable, runs: Callable[[str], AllocatedRun] | None = None, *,
                 allocator: Allocator | None = None,
                 deadline_at: float | None = None, policy: Policy = "monte_carlo", tool: str = "llm",
                 step_table: Callable[[Step], TierTable | None] | None = None,
                 history: Callable[[], Awaitable[Estimates]] | None = None) -> None:
        self.table = table
        self.history = history
        self.fitted: Fitted | None = None  # the table fitted from history (None: not read yet, or no history)
        self.step_table = step_table
        self.allocator = allocator if allocator is not None else Allocator(table)
        self._runs = runs
        self.deadline_at = deadline_at
        self.policy: Policy = policy
        self.tool = tool
        self._given: dict[tuple[str, str], Choice] = {}
        self._hurried: set[str] = set()  # runs under deadline pressure: their model: auto steps get the fastest tier
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deciding: asyncio.Lock | None = None
        self.decisions: list[Decision] = []

    def bind(self, runs: Callable[[str], AllocatedRun]) -> None:
        """Read runs through ``runs`` (``Engine.get``): the tool is built before the engine that runs it. Called on
        the engine's loop, it remembers it: a decision made in a worker thread (``executor: thread``) is journaled
        on that loop."""
        self._runs = runs
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def hurry(self, run_id: str) -> bool:
        """Give the remaining ``model: auto`` steps of run ``run_id`` the fastest of their tiers (deadline pressure,
        ``allocate/pressure_watch.py``); False if it was hurried already."""
        if run_id in self._hurried:
            return False
        self._hurried.add(run_id)
        return True

    def hurried(self, run_id: str) -> bool:
        return run_id in self._hurried

    def read_run(self, run_id: str) -> AllocatedRun:
        """Run ``run_id`` as the seam reads it (a cascade on the same table reads runs through this too)."""
        if self._runs is None:
            raise AllocationError("the allocator is not bound to an engine: call AllocationSeam.bind(engine.get)")
        return self._runs(run_id)

    async def decide(self, ctx: StepContext, auto: AutoArgs, *, budget_usd: float | None,
                     fits: Callable[[Choice], bool]) -> Decision:
        """The choice for the step ``ctx`` runs, from its run's remaining plan; journaled as ``allocation``.

        ``budget_usd`` is the dollars not yet spent (None: no dollar budget); ``fits`` whether a choice's reserved
        worst case fits what is left now. The run is read and ``fits`` asked here, on the caller's loop (a
        snapshot); the simulation runs in a worker thread, so the engine's loop is not held for its tens of
        milliseconds (on the virtual clock, time waits for it).
        """
        if self._runs is None:
            raise AllocationError("the allocator is not bound to an engine: call AllocationSeam.bind(engine.get)")
        if self._deciding is None:
            self._deciding = asyncio.Lock()
        # One decision at a time: each sees the choices made before it (steps ready together are decided in the
        # order they started, as if the decisions took no time), so runs replay.
        async with self._deciding:
            if self.history is not None and self.fitted is None:
                self.fitted = fitted_table(self.table, await self.history())
                self.allocator.table = self.fitted.table
            run = self._runs(ctx.run_id)
            if ctx.run_id in self._hurried:
                auto = self._fastest(run, ctx, auto, fits)
            problem = self.problem(run, ctx, auto, budget_usd)
            room = {c: fits(c) for c in problem.step(ctx.step_id).candidates()}
            decision = await asyncio.to_thread(self.allocator.decide, problem, ctx.step_id, fits=room.__getitem__,
                                               policy=self.policy)
            self._given[(ctx.run_id, ctx.step_id)] = decision.choice
        self.decisions.append(decision)
        tier = self.table[decision.choice.tier]
        data: dict[str, Any] = {
            "tier": tier.name, "model": tier.model, "samples": decision.choice.samples, "select": auto.select,
            "policy": decision.policy, "attempt": ctx.attempt, **decision.estimate.to_json(), "sims": decision.sims,
            "overhead_s": round(decision.overhead_s, 6), "compared": [c.to_json() for c in decision.compared],
        }
        if self.fitted is not None and any(self.fitted.calls.values()):
            data["history"] = {name: {"calls": n, "p_success": round(self.fitted.table[name].p_success, 4),
                                      "duration_s": round(self.fitted.table[name].duration_s, 3)}
                               for name, n in self.fitted.calls.items() if n}
        if decision.reason:
            data["reason"] = decision.reason
        elif ctx.run_id in self._hurried:
            data["reason"] = "deadline pressure: the fastest of the step's tiers"
        self._journal(run, data, ctx.step_id)
        return decision

    def _fastest(self, run: AllocatedRun, ctx: StepContext, auto: AutoArgs,
                 fits: Callable[[Choice], bool]) -> AutoArgs:
        """``auto`` narrowed to its fastest tiers (by the step's own profiles where it has them), unless none of
        those fits the budget left: then the step keeps its tiers and the allocator decides as before."""
        from planweave.allocate.pressure import fastest

        step = run.plan.steps.get(ctx.step_id)
        own = self.step_table(step) if self.step_table is not None and step is not None else None
        table = own or self.table
        quick = fastest({t: table[t].duration_s for t in auto.tiers}, auto.tiers)
        if not any(fits(Choice(t, k)) for t in quick for k in auto.samples):
            return auto
        return replace(auto, tiers=quick)

    def _journal(self, run: AllocatedRun, data: Mapping[str, Any], step: str) -> None:
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if self._loop is not None and here is not self._loop:
            self._loop.call_soon_threadsafe(run.record, "allocation", data, step)
        else:
            run.record("allocation", data, step)

    def problem(self, run: AllocatedRun, ctx: StepContext, auto: AutoArgs, budget_usd: float | None) -> Problem:
        """The rest of ``run`` as the allocator sees it, with ``ctx``'s step free to choose."""
        plan, state = run.plan, run.state
        now = ctx.clock.now()
        steps = []
        for sid in plan.order:
            rec = state.records.get(sid)
            if rec is None or rec.status in DONE:
                continue
            step = plan.steps[sid]
            options = self._options(run.plan, step, ctx, auto, rec.status, rec.attempts, rec.started_at, now)
            own = self.step_table(step) if self.step_table is not None else None
            steps.append(options if own is None else replace(options, table=own))
        deadline = None if self.deadline_at is None else max(0.0, self.deadline_at - now)
        return Problem(tuple(steps), budget_usd, deadline)

    def _options(self, plan: Plan, step: Step, ctx: StepContext, auto: AutoArgs, status: str, attempts: int,
                 started_at: float | None, now: float) -> StepOptions:
        deps = plan.deps[step.id]
        backoff = Backoff(step.retries.backoff, step.retries.factor, step.retries.max_backoff)
        total = step.retries.max + 1
        if step.id == ctx.step_id:
            return StepOptions(step.id, deps, auto.tiers, auto.samples, auto.select,
                               attempts=max(1, total - ctx.attempt + 1), backoff=backoff)
        fixed_s = step.estimate.duration if step.estimate is not None else 0.0
        fixed_usd = step.estimate.cost if step.estimate is not None else 0.0
        if step.tool != self.tool:
            return StepOptions(step.id, deps, fixed_s=fixed_s, fixed_usd=fixed_usd)
        args = step.args
        running = status in ("running", "waiting_input")
        elapsed = max(0.0, now - started_at) if running and started_at is not None else 0.0
        left = max(1, total - attempts + (1 if running else 0))
        if args.get("model") == "auto":
            try:
                theirs = AutoArgs.parse(self.table, args, step=step.id)
            except AllocationError:
                return StepOptions(step.id, deps, fixed_s=fixed_s, fixed_usd=fixed_usd)  # it fails on its own
            given = self._given.get((ctx.run_id, step.id))
            if running:
                pinned = given or Choice(theirs.tiers[0], theirs.samples[0])
                return StepOptions(step.id, deps, theirs.tiers, theirs.samples, theirs.select, attempts=left,
                                   backoff=backoff, chosen=pinned, elapsed_s=elapsed)
            return StepOptions(step.id, deps, theirs.tiers, theirs.samples, theirs.select, attempts=left,
                               backoff=backoff)
        model = args.get("model")
        tier = self.table.by_model(model) if isinstance(model, str) else None
        if tier is None:
            return StepOptions(step.id, deps, fixed_s=fixed_s, fixed_usd=fixed_usd)
        samples = args.get("samples")
        k = samples if isinstance(samples, int) and not isinstance(samples, bool) and samples > 0 else 1
        return StepOptions(step.id, deps, (tier.name,), (k,), args.get("select") or "first_valid", attempts=left,
                           backoff=backoff, chosen=Choice(tier.name, k), elapsed_s=elapsed)
