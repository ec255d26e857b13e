"""The planner itself allocated (``planweave goal G --model auto --config tiers=FILE``): before each planner call.

:class:`PlannerAllocation` takes the place of a :class:`~planweave.allocate.cascade_seam.PlannerCascade` in the
planning loop (the same interface; ``planning/loop.py`` asks :meth:`choose` before each of its calls: plan,
re-plan, repair, join). It asks the Monte Carlo :class:`~planweave.allocate.Allocator` which tier maximises P(the
run completes within budget and deadline), the planner's call as the first step of the problem and the run's
unfinished steps after it (their ``estimate:``), with the dollars and seconds left; the decision is journaled as an
``allocation`` event without a step, its data ``step: "planner"`` and ``purpose``. The tiers' profiles are the
declared table, fitted from the journal's history if ``history`` is given (``allocate/history.py``), and updated by
what this run's planner did: each accepted reply a success of the tier that wrote it, each rejected one a failure,
with the declared profile as the prior (:data:`~planweave.allocate.history.PRIOR_WEIGHT` calls). So a tier whose
plan was rejected is weighed again for the repair (receding horizon).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from planweave.allocate.allocator import Allocator
from planweave.allocate.cascade import Shift
from planweave.allocate.cascade_seam import PlannedRun, PlannerCascade, PlannerRun
from planweave.allocate.history import PRIOR_WEIGHT, fitted_table
from planweave.allocate.model import Choice, Problem, StepOptions, TierTable
from planweave.allocate.monitors import Signal
from planweave.core.clock import RealClock
from planweave.forecast.estimates import Estimates
from planweave.models import Budget

PLANNER = "planner"
_DONE = frozenset({"succeeded", "skipped", "cancelled"})


class PlannerAllocation(PlannerCascade):
    """A goal run's planner tier chosen by Monte Carlo before each call (see the module docstring).

    ``budget`` is the run's (its dollars left bound the choice), ``deadline_at`` the clock time the run must end by
    (None: no deadline), ``history`` the estimates of past runs (read once, before the first decision), ``now`` the
    engine's clock.
    """

    mode = "auto"

    def __init__(self, table: TierTable, tiers: list[str] | tuple[str, ...] | None = None, *,
                 allocator: Allocator | None = None, budget: Budget | None = None, deadline_at: float | None = None,
                 history: Callable[[], Awaitable[Estimates]] | None = None,
                 now: Callable[[], float] | None = None) -> None:
        super().__init__(table, tiers)
        self.now = now if now is not None else RealClock().now
        self.allocator = allocator if allocator is not None else Allocator(table)
        self.budget = budget
        self.deadline_at = deadline_at
        self.history = history
        self._prior: TierTable | None = None  # the declared table, fitted from history once
        self._chosen: dict[str, str] = {}  # run -> the tier its planner's next (or last) call runs on
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}  # (run, tier) -> (accepted, rejected) replies
        self._deciding = asyncio.Lock()

    def model(self, run_id: str) -> str:
        tier = self._chosen.get(run_id)
        if tier is None:
            tier = min(self.tiers, key=lambda t: (self.table[t].cost_usd, t))
        return self.table[tier].model

    def observe(self, run: PlannedRun, signal: Signal) -> Shift | None:
        """Count the reply of the tier that wrote it: ``succeeded`` accepted, ``failed``/``rejected`` not."""
        tier = self._chosen.get(run.id)
        if tier is not None:
            ok, bad = self._seen.get((run.id, tier), (0, 0))
            self._seen[(run.id, tier)] = (ok + 1, bad) if signal.kind == "succeeded" else (ok, bad + 1)
        return None

    def restore(self, run_id: str, escalations: list[dict[str, Any]]) -> None:
        return None  # nothing to go on from: each call is decided afresh

    def forget(self, run_id: str) -> None:
        self._chosen.pop(run_id, None)
        for key in [k for k in self._seen if k[0] == run_id]:
            del self._seen[key]

    def _table(self, run_id: str, prior: TierTable) -> TierTable:
        """``prior`` with this run's accepted and rejected replies per tier taken in."""
        tiers = {}
        for name, tier in prior.tiers.items():
            ok, bad = self._seen.get((run_id, name), (0, 0))
            n = ok + bad
            p = (PRIOR_WEIGHT * tier.p_success + ok) / (PRIOR_WEIGHT + n)
            tiers[name] = replace(tier, p_success=p) if n else tier
        return TierTable(tiers)

    def problem(self, run: PlannerRun, table: TierTable) -> Problem:
        """The planner's call, then the run's unfinished steps (their estimates), with the dollars and seconds
        left."""
        steps = [StepOptions(PLANNER, (), self.tiers, (1,), table=table)]
        for sid in run.plan.order:
            rec = run.state.records.get(sid)
            if rec is None or rec.status in _DONE:
                continue
            step = run.plan.steps[sid]
            estimate = step.estimate
            steps.append(StepOptions(sid, (PLANNER, *run.plan.deps[sid]),
                                     fixed_s=estimate.duration if estimate is not None else 0.0,
                                     fixed_usd=estimate.cost if estimate is not None else 0.0))
        budget = None
        if self.budget is not None and self.budget.usd_limit is not None:
            budget = self.budget.usd_limit - self.budget.spent_usd
        deadline = None if self.deadline_at is None else max(0.0, self.deadline_at - self.now())
        return Problem(tuple(steps), budget, deadline)

    async def choose(self, run: PlannerRun, purpose: str) -> None:
        """Decide the tier of the planner's next call of run ``run`` (``purpose``: plan, replan, repair, join) and
        journal it."""
        async with self._deciding:
            if self._prior is None:
                self._prior = self.table if self.history is None else fitted_table(self.table,
                                                                                   await self.history()).table
            table = self._table(run.id, self._prior)
            problem = self.problem(run, table)
            remaining = None if self.budget is None else self.budget.remaining_usd

            def fits(choice: Choice) -> bool:
                return remaining is None or table[choice.tier].cost_usd <= remaining

            decision = await asyncio.to_thread(self.allocator.decide, problem, PLANNER, fits=fits)
        self._chosen[run.id] = decision.choice.tier
        tier = self.table[decision.choice.tier]
        data: dict[str, Any] = {
            "step": PLANNER, "purpose": purpose, "tier": tier.name, "model": tier.model, "samples": 1,
            "policy": decision.policy, **decision.estimate.to_json(), "sims": decision.sims,
            "overhead_s": round(decision.overhead_s, 6), "compared": [c.to_json() for c in decision.compared],
        }
        if decision.reason:
            data["reason"] = decision.reason
        run.record("allocation", data)
