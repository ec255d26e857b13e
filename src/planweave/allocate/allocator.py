"""The allocator: tier and sample count per step, to maximise P(the run completes within budget and deadline).

A pure object a runtime drives (like :mod:`planweave.core.scheduler`): given the remaining plan as a
:class:`~planweave.allocate.model.Problem`, :meth:`Allocator.decide` returns the choice for the step about to run,
with the allocation of the rest of the plan it assumed and the candidates it compared. Called again after every
outcome (each dispatch of an ``auto`` step, each retry), it re-plans the rest from what is known then: a receding
horizon.

How (MCPP, Monte Carlo portfolio planning): every step's outcomes under every candidate are simulated once on common
random numbers (:mod:`planweave.allocate.simulate`); then a greedy coordinate ascent starts from the cheapest
allocation and, step by step, moves each step to the candidate that maximises P(all steps succeed, total dollars
<= budget, makespan <= deadline) with the others held, until a sweep changes nothing. Changing one step ``s``
needs no new simulation of the others: per run, the makespan is ``max(M, head + d_s + tail)``, where ``M`` is the
longest path avoiding ``s`` (a forward pass with ``s`` at zero seconds), ``head`` when ``s`` can start and
``tail`` the longest path after it. Ties (common when a loose budget and deadline make several choices certain) go
to the lower expected cost, then the shorter expected makespan.

Not modelled: capacities and concurrency limits (steps start as soon as their inputs exist), fallbacks and
re-plans; a step that fails for good fails the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from planweave.allocate.model import (
    AllocationError,
    Candidate,
    Choice,
    Decision,
    Estimate,
    Problem,
    StepOptions,
    TierTable,
)
from planweave.allocate.simulate import Draws, Outcomes, finish_times, step_outcomes, tails

Policy = Literal["monte_carlo", "greedy", "cheapest", "strongest"]
POLICIES: tuple[Policy, ...] = ("monte_carlo", "greedy", "cheapest", "strongest")


@dataclass(frozen=True, slots=True)
class _Index:
    """The problem's steps by index: dependencies and successors among the remaining steps."""

    ids: tuple[str, ...]
    deps: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, problem: Problem) -> _Index:
        ids = tuple(s.id for s in problem.steps)
        where = {sid: i for i, sid in enumerate(ids)}
        deps: list[tuple[int, ...]] = []
        for i, s in enumerate(problem.steps):
            ds: list[int] = []
            for d in s.deps:
                if d not in where:
                    continue  # finished already: it delays nothing
                if where[d] >= i:
                    raise AllocationError(f"step '{s.id}' comes before its dependency '{d}' in the remaining plan")
                ds.append(where[d])
            deps.append(tuple(ds))
        succs: list[list[int]] = [[] for _ in ids]
        for i, found in enumerate(deps):
            for p in found:
                succs[p].append(i)
        return cls(ids, tuple(deps), tuple(tuple(s) for s in succs))


class Allocator:
    """Chooses tier and samples per step by Monte Carlo over the remaining plan (see the module docstring).

    ``sims`` simulated runs per decision, ``seed`` for the common random numbers, at most ``sweeps`` passes of the
    coordinate ascent; ``greedy_target`` is the per-step success probability the ``greedy`` policy buys.
    """

    def __init__(self, table: TierTable, *, sims: int = 200, seed: int = 0, sweeps: int = 3,
                 greedy_target: float = 0.95) -> None:
        if sims < 1:
            raise AllocationError(f"sims must be at least 1, got {sims}")
        self.table = table
        self.sims = sims
        self.seed = seed
        self.sweeps = sweeps
        self.greedy_target = greedy_target

    # -- the decision -----------------------------------------------------------------------------------------
    def decide(self, problem: Problem, step_id: str, *, fits: Callable[[Choice], bool] | None = None,
               policy: Policy = "monte_carlo") -> Decision:
        """The choice for ``step_id`` (a free step of ``problem``) under ``policy``.

        ``fits`` says whether a candidate's reserved worst case fits the budget left now; a candidate that does not
        is never chosen (when none fits, the cheapest is returned with a reason, and its call fails on the budget as
        it would without an allocator).
        """
        started = time.perf_counter()
        target = problem.step(step_id)
        if not target.free:
            raise AllocationError(f"step '{step_id}' has no tiers to choose from")
        for s in problem.steps:
            for tier in (*s.tiers, *((s.chosen.tier,) if s.chosen is not None else ())):
                (s.table or self.table)[tier]  # an unknown tier is an error before anything is simulated
        fit = fits if fits is not None else (lambda _c: True)
        index = _Index.of(problem)
        outcomes = self._outcomes(problem)
        cheapest = self._cheapest_each(problem, outcomes)
        if policy == "monte_carlo":
            plan = self._ascend(problem, index, outcomes, cheapest, step_id, fit)
        else:
            plan = {s.id: self._myopic(s, outcomes[s.id], policy) for s in problem.steps if s.free}
        compared = self._compare(problem, index, outcomes, plan, step_id, fit)
        allowed = [c for c in compared if c.fits]
        reason = ""
        if policy == "monte_carlo" and allowed:
            best = self._best(allowed)
            choice = best.choice
        elif allowed and fit(plan[step_id]):
            choice = plan[step_id]
            best = next(c for c in compared if c.choice == choice)
        elif allowed:  # the myopic choice does not fit now: the nearest cheaper one that does
            best = min(allowed, key=lambda c: (c.estimate.cost_usd, c.choice))
            choice = best.choice
            reason = f"{policy} chose {plan[step_id].tier} x{plan[step_id].samples}, whose worst case does not fit"
        else:
            best = min(compared, key=lambda c: (c.estimate.cost_usd, c.choice))
            choice = best.choice
            reason = "no candidate's worst case fits the budget left: the cheapest is tried"
        plan = {**plan, step_id: choice}
        return Decision(step=step_id, choice=choice, plan=plan, estimate=best.estimate, compared=compared,
                        sims=self.sims, policy=policy, overhead_s=time.perf_counter() - started, reason=reason)

    # -- simulation -------------------------------------------------------------------------------------------
    def _outcomes(self, problem: Problem) -> dict[str, dict[Choice | None, Outcomes]]:
        """Every step's outcomes under every candidate (fixed steps: their one outcome, under None or their
        pinned choice), on common random numbers."""
        result: dict[str, dict[Choice | None, Outcomes]] = {}
        for s in problem.steps:
            cands = s.candidates()
            if not cands:
                result[s.id] = {None: step_outcomes(s, None, self.table, None, self.sims)}
                continue
            draws = Draws(self.seed, s.id, self.sims, s.attempts, max(c.samples for c in cands))
            result[s.id] = {c: step_outcomes(s, c, self.table, draws, self.sims) for c in cands}
        return result

    def _cheapest_each(self, problem: Problem, outcomes: Mapping[str, Mapping[Choice | None, Outcomes]]
                       ) -> dict[str, Choice | None]:
        plan: dict[str, Choice | None] = {}
        for s in problem.steps:
            cands = s.candidates()
            plan[s.id] = (min(cands, key=lambda c: (outcomes[s.id][c].mean_usd, c.samples, c.tier))
                          if cands else None)
        return plan

    def _myopic(self, step: StepOptions, outs: Mapping[Choice | None, Outcomes], policy: Policy) -> Choice:
        """The per-step baselines: cheapest (lowest expected cost), strongest (highest tier success, fewest
        samples), greedy (the cheapest whose own success probability reaches the target, else the likeliest)."""
        cands = step.candidates()

        def cost(c: Choice) -> tuple[float, int, str]:
            return outs[c].mean_usd, c.samples, c.tier

        if policy == "cheapest":
            return min(cands, key=cost)
        if policy == "strongest":
            table = step.table or self.table
            top = max(table[c.tier].p_success for c in cands)
            return min((c for c in cands if table[c.tier].p_success == top), key=cost)
        p = {c: sum(outs[c].ok) / len(outs[c].ok) for c in cands}
        good = [c for c in cands if p[c] >= self.greedy_target]
        return min(good, key=cost) if good else max(cands, key=lambda c: (p[c], -cost(c)[0]))

    def _context(self, problem: Problem, index: _Index, seconds: list[list[float]], usd: list[list[float]],
                 ok: list[list[bool]], x: int) -> tuple[list[float], list[float], list[float], list[bool],
                                                        list[float]]:
        """Per run, with step ``x`` taken out: the longest path avoiding it, when it can start, the longest path
        after it, whether every other step succeeded, and the other steps' dollars."""
        sims = self.sims
        order = range(len(index.ids))
        held = seconds[x]
        seconds[x] = [0.0] * sims
        finish = finish_times(order, index.deps, seconds, sims)
        seconds[x] = held
        avoiding = list(map(max, *finish)) if len(finish) > 1 else [0.0] * sims
        head = finish[x]
        succs = index.succs[x]
        if succs:
            tail_all = tails(order, index.succs, seconds, sims)
            after = list(map(max, *(tail_all[s] for s in succs))) if len(succs) > 1 else tail_all[succs[0]]
        else:
            after = [0.0] * sims
        others_ok = [True] * sims
        others_usd = [0.0] * sims
        for y in order:
            if y != x:
                others_ok = [a and b for a, b in zip(others_ok, ok[y], strict=True)]
                others_usd = [a + b for a, b in zip(others_usd, usd[y], strict=True)]
        return avoiding, head, after, others_ok, others_usd

    def _estimate(self, problem: Problem, context: tuple[list[float], list[float], list[float], list[bool],
                                                         list[float]], out: Outcomes) -> Estimate:
        avoiding, head, after, others_ok, others_usd = context
        budget = problem.budget_usd if problem.budget_usd is not None else float("inf")
        deadline = problem.deadline_s if problem.deadline_s is not None else float("inf")
        n_all = n_ok = n_budget = n_deadline = 0
        total_usd = total_s = 0.0
        for m, h, t, o, c, ok, s, u in zip(avoiding, head, after, others_ok, others_usd, out.ok, out.seconds,
                                           out.usd, strict=True):
            makespan = max(m, h + s + t)
            usd = c + u
            good = o and ok
            in_budget = usd <= budget
            in_time = makespan <= deadline
            n_ok += good
            n_budget += in_budget
            n_deadline += in_time
            n_all += good and in_budget and in_time
            total_usd += usd
            total_s += makespan
        n = self.sims
        return Estimate(n_all / n, n_ok / n, n_budget / n, n_deadline / n, total_usd / n, total_s / n)

    def _columns(self, problem: Problem, outcomes: Mapping[str, Mapping[Choice | None, Outcomes]],
                 plan: Mapping[str, Choice | None]) -> tuple[list[list[float]], list[list[float]], list[list[bool]]]:
        seconds, usd, ok = [], [], []
        for s in problem.steps:
            out = outcomes[s.id][plan[s.id]] if s.candidates() else outcomes[s.id][None]
            seconds.append(list(out.seconds))
            usd.append(list(out.usd))
            ok.append(list(out.ok))
        return seconds, usd, ok

    def _best(self, candidates: list[Candidate]) -> Candidate:
        return min(candidates, key=lambda c: (-c.estimate.p_all, c.estimate.cost_usd, c.estimate.makespan_s,
                                              c.choice))

    def _ascend(self, problem: Problem, index: _Index, outcomes: Mapping[str, Mapping[Choice | None, Outcomes]],
                start: Mapping[str, Choice | None], step_id: str, fit: Callable[[Choice], bool]
                ) -> dict[str, Choice]:
        """Greedy coordinate ascent from ``start``: the step decided first (only candidates that fit), then the
        others in plan order, until a sweep changes nothing."""
        plan = dict(start)
        free = [i for i, s in enumerate(problem.steps) if s.free]
        here = index.ids.index(step_id)
        free.sort(key=lambda i: (i != here, i))
        seconds, usd, ok = self._columns(problem, outcomes, plan)
        for _ in range(self.sweeps):
            changed = False
            for x in free:
                s = problem.steps[x]
                cands = [c for c in s.candidates() if x != here or fit(c)] or s.candidates()
                context = self._context(problem, index, seconds, usd, ok, x)
                scored = [Candidate(c, self._estimate(problem, context, outcomes[s.id][c]), True) for c in cands]
                best = self._best(scored).choice
                if best != plan[s.id]:
                    plan[s.id] = best
                    out = outcomes[s.id][best]
                    seconds[x], usd[x], ok[x] = list(out.seconds), list(out.usd), list(out.ok)
                    changed = True
            if not changed:
                break
        return {sid: c for sid, c in plan.items() if c is not None and problem.step(sid).free}

    def _compare(self, problem: Problem, index: _Index, outcomes: Mapping[str, Mapping[Choice | None, Outcomes]],
                 plan: Mapping[str, Choice], step_id: str, fit: Callable[[Choice], bool]) -> list[Candidate]:
        """Every candidate of ``step_id`` estimated with the rest of the plan allocated as ``plan``."""
        full: dict[str, Choice | None] = {s.id: plan.get(s.id, s.chosen) for s in problem.steps}
        seconds, usd, ok = self._columns(problem, outcomes, full)
        x = index.ids.index(step_id)
        context = self._context(problem, index, seconds, usd, ok, x)
        step = problem.steps[x]
        return [Candidate(c, self._estimate(problem, context, outcomes[step_id][c]), fit(c))
                for c in step.candidates()]
