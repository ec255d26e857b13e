"""Forecasts: the rest of a plan simulated many times on virtual time with the engine's own scheduler (pure).

:func:`forecast` takes a validated :class:`Plan` (not started) or a :class:`RunState` (a running or interrupted run,
from its current state: succeeded steps are done, running ones have run for their elapsed time), an
:class:`Estimates` table, and optionally a deadline and a budget. Each simulated run is a discrete-event simulation:
the engine's :class:`Scheduler` (critical-path priority with aging, concurrency, capacities, read/write locks) admits
ready steps; each attempt's duration, success and cost are drawn from the step's :class:`StepModel`; a failure is
retried by the step's own retry policy (timeouts by its ``timeout``), then its fallback is tried once, then the step
fails for good (the run stops under ``on_failure: stop``, else its dependents are skipped). Completions at the same
instant are all applied before admission, as the engine does.

Why not the engine itself on the virtual clock: it does the same work plus journaling, tasks and the fold, about
20x slower per simulated run (docs/forecast.md gives the figures); the calibration tests compare this against real
engine runs instead.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planweave.core.plan.graph import Plan
from planweave.core.plan.model import Claim
from planweave.core.scheduler import Scheduler
from planweave.core.state import RunState
from planweave.forecast.estimates import Estimates, StepModel

ENGINE_CONCURRENCY = 64
"""The engine's default concurrency (``engine/runtime.py`` ``DEFAULT_CONCURRENCY``; a test keeps them equal)."""

_FINISH, _READY = 0, 1


@dataclass(frozen=True)
class Quantiles:
    """The 50th, 90th and 99th percentiles of simulated values."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Quantiles:
        ordered = sorted(values)
        return cls(*(_quantile(ordered, q) for q in (0.5, 0.9, 0.99)))

    def to_json(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99}


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile: the smallest value with at least ``q`` of the values at or below it."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Forecast:
    """The result of :func:`forecast`. ``p_deadline``/``p_budget`` are None when no deadline/budget was given;
    ``p_all`` is the chance of succeeding within every limit given. Times are seconds from the run's start."""

    runs: int
    p_success: float
    p_deadline: float | None
    p_budget: float | None
    p_all: float
    makespan: Quantiles
    cost_usd: Quantiles
    critical_steps: tuple[str, ...]
    criticality: Mapping[str, float]
    deadline: float | None = None
    budget_usd: float | None = None
    elapsed: float = 0.0
    histogram: tuple[tuple[float, int], ...] = field(default=())  # (bucket start, count) of makespans
    success_known: bool = True  # False: the history holds no outcome, so p_success and p_all say nothing
    untimed: tuple[str, ...] = ()  # steps whose duration nothing gives (no history, estimate: or literal): instant

    def to_json(self) -> dict[str, Any]:
        """The forecast as JSON; ``p_success`` and ``p_all`` are null when success is unknown (no history)."""
        known = self.success_known
        return {
            "runs": self.runs, "p_deadline": self.p_deadline, "p_budget": self.p_budget,
            "p_success": self.p_success if known else None, "p_all": self.p_all if known else None,
            "history": known, "untimed": list(self.untimed), "makespan": self.makespan.to_json(),
            "cost_usd": self.cost_usd.to_json(), "critical_steps": list(self.critical_steps),
            "criticality": dict(self.criticality), "deadline": self.deadline, "budget_usd": self.budget_usd,
            "elapsed": self.elapsed, "histogram": [list(b) for b in self.histogram],
        }


@dataclass
class _Start:
    """Where every simulated run starts: the state of each step at the forecast's time 0."""

    done: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)  # failed, skipped or cancelled for good
    ready: dict[str, float] = field(default_factory=dict)  # step -> when it is (again) ready, seconds from now
    running: dict[str, float] = field(default_factory=dict)  # step -> seconds its attempt has run
    attempts: dict[str, int] = field(default_factory=dict)
    fallback: set[str] = field(default_factory=set)
    elapsed: float = 0.0
    spent: float = 0.0
    on_failure: str = "stop"


def _start_of_plan(plan: Plan) -> _Start:
    start = _Start(on_failure=plan.spec.on_failure or "stop")
    start.ready = {sid: 0.0 for sid in plan.order if not plan.deps[sid]}
    return start


def _start_of_run(state: RunState, now: float) -> _Start:
    """The run's steps at ``now``: a step waiting for a person counts as ready (people are not simulated)."""
    created = state.created_at if state.created_at is not None else now
    start = _Start(elapsed=max(0.0, now - created), spent=state.cost_usd,
                   on_failure=state.on_failure)
    for sid, rec in state.records.items():
        start.attempts[sid] = rec.attempts
        if rec.fallback_active:
            start.fallback.add(sid)
        status = rec.status
        if status == "succeeded":
            start.done.add(sid)
        elif status == "running" or status == "waiting_input":
            log = rec.attempt_log
            began = log[-1][1] if log else (rec.started_at if rec.started_at is not None else now)
            start.running[sid] = max(0.0, now - began)
        elif status in ("ready", "waiting_approval", "unknown") or (status == "cancelled" and rec.resumable):
            start.ready[sid] = 0.0 if rec.retry_at is None else max(0.0, rec.retry_at - now)
        elif status != "pending":
            start.dead.add(sid)
    return start


@dataclass(frozen=True)
class RunSnapshot:
    """A run's plan and where each of its steps is at one moment: what a forecast of the run needs, copied out of
    its live state so that the simulation may run elsewhere (a thread) while the run goes on."""

    plan: Plan
    start: _Start


def snapshot(state: RunState, now: float | None = None) -> RunSnapshot:
    """The snapshot of ``state`` at ``now`` (its clock's time; default: its latest recorded time)."""
    return RunSnapshot(state.plan, _start_of_run(state, _latest_time(state) if now is None else now))


class _Simulation:
    """One forecast's precomputed plan and models; :meth:`run` simulates the rest of the plan once."""

    def __init__(self, plan: Plan, estimates: Estimates, start: _Start, concurrency: int | None,
                 capacities: Mapping[str, int], overrides: Mapping[str, StepModel]) -> None:
        self.plan = plan
        self.start = start
        self.concurrency = concurrency
        self.capacities = capacities
        prints = plan.fingerprints
        self.models: dict[str, StepModel] = {}
        self.fallback_models: dict[str, StepModel] = {}
        for sid in plan.order:
            step = plan.steps[sid]
            found = overrides.get(sid)
            self.models[sid] = found if found is not None else estimates.step_model(step, prints[sid])
            if step.fallback is not None:
                self.fallback_models[sid] = estimates.step_model(step, prints[sid], tool=step.fallback.tool)
        self.success_known = estimates.pooled.known or bool(overrides)
        self.waiting = {sid: sum(1 for d in plan.deps[sid] if d not in start.done) for sid in plan.order}
        self.timeouts = {sid: plan.steps[sid].timeout for sid in plan.order}

    def run(self, rng: random.Random) -> tuple[float, float, bool, list[str]]:
        """One simulated run: (seconds until it ends, cost of the rest, whether every step succeeded, the chain of
        steps that determined its end)."""
        return _Trial(self, rng).run()


class _Trial:
    """The mutable state of one simulated run."""

    def __init__(self, sim: _Simulation, rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.plan = sim.plan
        self.sched: Scheduler[str] = Scheduler(sim.concurrency, sim.capacities)
        self.waiting = dict(sim.waiting)
        self.attempts = dict(sim.start.attempts)
        self.fallback = set(sim.start.fallback)
        self.dead = set(sim.start.dead)
        self.done = set(sim.start.done)
        self.pending: set[str] = set(self.plan.order) - self.done - self.dead
        self.events: list[tuple[float, int, int, str, bool, str]] = []
        self.seq = 0
        self.cost = 0.0
        self.now = 0.0
        self.end = 0.0
        self.released_by: dict[str, str] = {}
        self.last: str | None = None
        self.stopped = False

    def _push(self, at: float, kind: int, sid: str, ok: bool = True, why: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, sid, ok, why))

    def _queue(self, sid: str, *, first: bool = False) -> None:
        rank = math.inf if first else self.plan.rank[sid]
        self.sched.push(sid, rank=rank, ready_at=self.now, claim=self.plan.claims[sid])

    def _attempt(self, sid: str, elapsed: float | None = None) -> None:
        """Start an attempt of ``sid`` now (``elapsed``: one already running for that long)."""
        sim = self.sim
        in_fallback = sid in self.fallback and sid in sim.fallback_models
        model = sim.fallback_models[sid] if in_fallback else sim.models[sid]
        rng = self.rng
        duration = model.sample_duration(rng)
        if elapsed is None:
            self.attempts[sid] = self.attempts.get(sid, 0) + 1
            elapsed = 0.0
        else:  # running for `elapsed` already: the draw is conditioned on lasting at least that
            for _ in range(32):
                if duration >= elapsed:
                    break
                duration = model.sample_duration(rng)
            duration = max(0.0, duration - elapsed)
        self.cost += model.cost_usd
        self.seq += 1
        timeout = sim.timeouts[sid]
        if timeout is not None and duration + elapsed > timeout:
            heapq.heappush(self.events, (self.now + max(0.0, timeout - elapsed), self.seq, _FINISH, sid, False,
                                         "timeout"))
            return
        p = model.p_success
        if model.p_retry is not None and not in_fallback and self.attempts.get(sid, 1) > 1:
            p = model.p_retry  # a retry: its own rate (a step that fails once by design succeeds on its retry)
        ok = p >= 1.0 or rng.random() < p
        heapq.heappush(self.events, (self.now + duration, self.seq, _FINISH, sid, ok, "" if ok else "error"))

    def run(self) -> tuple[float, float, bool, list[str]]:
        start = self.sim.start
        for sid in start.running:
            self._queue(sid, first=True)
        for sid, _claim in self.sched.admit():
            self._attempt(sid, start.running[sid])
        for sid, at in start.ready.items():
            self._push(at, _READY, sid)
        events = self.events
        while events and not self.stopped:
            self.now = events[0][0]
            while events and events[0][0] == self.now and not self.stopped:
                _, _, kind, sid, ok, why = heapq.heappop(events)
                if kind == _READY:
                    self._queue(sid)
                else:
                    self._finish(sid, ok, why)
            if not self.stopped:
                for sid, _claim in self.sched.admit():
                    self._attempt(sid)
        success = not self.stopped and len(self.done) == len(self.plan.order)
        return self.end, self.cost, success, self._chain()

    def _finish(self, sid: str, ok: bool, why: str) -> None:
        self.sched.release(self.plan.claims[sid])
        self.end = self.now
        if ok:
            self.done.add(sid)
            self.pending.discard(sid)
            self.last = sid
            for child in self.plan.dependents[sid]:
                left = self.waiting[child] - 1
                self.waiting[child] = left
                if left == 0 and child in self.pending:
                    self.released_by[child] = sid
                    self._queue(child)
            return
        step = self.plan.steps[sid]
        policy = step.retries
        attempt = self.attempts.get(sid, 1)
        if attempt <= policy.max and policy.retries_on(why) and sid not in self.fallback:
            self._push(self.now + policy.delay(attempt, self.rng.random()), _READY, sid)
        elif step.fallback is not None and sid not in self.fallback:
            self.fallback.add(sid)
            self._push(self.now, _READY, sid)
        else:
            self._fail(sid)

    def _fail(self, sid: str) -> None:
        if self.sim.start.on_failure == "stop":
            self.stopped = True
            return
        stack = [sid]
        while stack:
            s = stack.pop()
            if s in self.pending:
                self.pending.discard(s)
                self.dead.add(s)
                stack.extend(self.plan.dependents[s])

    def _chain(self) -> list[str]:
        """The steps whose completions, one releasing the next, ended the run (its critical chain), first first."""
        chain: list[str] = []
        step = self.last
        while step is not None:
            chain.append(step)
            step = self.released_by.get(step)
        chain.reverse()
        return chain


def _claims_fit(plan: Plan, capacities: Mapping[str, int]) -> None:
    for sid in plan.order:
        claim: Claim | None = plan.claims[sid]
        for name, amount in claim.amounts.items() if claim else ():
            if name not in capacities:
                raise ValueError(f"step '{sid}' claims '{name}', which has no capacity (give it with capacities)")
            if amount > capacities[name]:
                raise ValueError(f"step '{sid}' claims {amount} of '{name}', more than its capacity "
                                 f"{capacities[name]}")


def forecast(
    target: Plan | RunState | RunSnapshot,
    estimates: Estimates | None = None,
    *,
    deadline: float | None = None,
    budget_usd: float | None = None,
    runs: int = 1000,
    seed: int = 0,
    concurrency: int | None = ENGINE_CONCURRENCY,
    capacities: Mapping[str, int] | None = None,
    now: float | None = None,
    overrides: Mapping[str, StepModel] | None = None,
) -> Forecast:
    """Simulate the rest of ``target`` ``runs`` times and summarise: success, deadline and budget probabilities,
    makespan and cost percentiles (from the run's start), and the steps most often on the critical chain.

    ``target`` is a plan (simulated from its start), a run's state at ``now`` (its clock's time; default: its
    last step's latest time) or a :func:`snapshot` of one. ``deadline`` is seconds from the run's start;
    ``budget_usd`` its whole budget (the run's cost so far counts). ``concurrency`` and ``capacities`` are the
    engine's (the plan's own capacities are adopted where the engine has none, as the engine does). Deterministic
    for a given ``seed``. ``overrides`` replaces the model of the steps it names (an allocator comparing a tier or
    a sample count for a step gives that choice's duration, success and cost); a fallback keeps its own.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if isinstance(target, RunState):
        target = snapshot(target, now)
    if isinstance(target, RunSnapshot):
        plan, start = target.plan, target.start
    else:
        plan = target
        start = _start_of_plan(plan)
        if concurrency == ENGINE_CONCURRENCY and plan.spec.concurrency is not None:
            concurrency = plan.spec.concurrency
    caps = dict(capacities or {})
    for name, amount in plan.spec.capacities.items():
        caps.setdefault(name, amount)
    _claims_fit(plan, caps)
    sim = _Simulation(plan, estimates or Estimates(), start, concurrency, caps, overrides or {})
    rng = random.Random(seed)
    makespans: list[float] = []
    costs: list[float] = []
    successes = in_time = in_budget = all_ok = 0
    on_chain: dict[str, int] = {}
    for _ in range(runs):
        end, cost, ok, chain = sim.run(rng)
        makespan, total = start.elapsed + end, start.spent + cost
        makespans.append(makespan)
        costs.append(total)
        timely = deadline is None or makespan <= deadline
        cheap = budget_usd is None or total <= budget_usd
        successes += ok
        in_time += timely
        in_budget += cheap
        all_ok += ok and timely and cheap
        for sid in chain:
            on_chain[sid] = on_chain.get(sid, 0) + 1
    criticality = {sid: on_chain[sid] / runs for sid in plan.order if sid in on_chain}
    return Forecast(
        runs=runs, p_success=successes / runs,
        p_deadline=None if deadline is None else in_time / runs,
        p_budget=None if budget_usd is None else in_budget / runs,
        p_all=all_ok / runs, makespan=Quantiles.of(makespans), cost_usd=Quantiles.of(costs),
        critical_steps=tuple(sid for sid, share in criticality.items() if share >= 0.5),
        criticality=criticality, deadline=deadline, budget_usd=budget_usd, elapsed=start.elapsed,
        histogram=_histogram(makespans), success_known=sim.success_known,
        untimed=tuple(sid for sid in plan.order if sid not in start.done and not sim.models[sid].timed),
    )


def _latest_time(state: RunState) -> float:
    """The latest time a run's state records (the forecast's "now" when none is given)."""
    times = [0.0 if state.created_at is None else state.created_at]
    for rec in state.records.values():
        for entry in rec.attempt_log:
            times.append(entry[2] if entry[2] is not None else entry[1])
    return max(times)


def _histogram(values: Sequence[float], buckets: int = 20) -> tuple[tuple[float, int], ...]:
    """``buckets`` equal-width bins of ``values``: (start of the bin, count)."""
    low, high = min(values), max(values)
    if high <= low:
        return ((low, len(values)),)
    width = (high - low) / buckets
    counts = [0] * buckets
    for v in values:
        counts[min(buckets - 1, int((v - low) / width))] += 1
    return tuple((low + i * width, c) for i, c in enumerate(counts))


__all__ = ["ENGINE_CONCURRENCY", "Forecast", "Quantiles", "RunSnapshot", "forecast", "snapshot"]
