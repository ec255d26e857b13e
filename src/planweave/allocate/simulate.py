"""Monte Carlo over the remaining plan with common random numbers: what each step does under each choice, per run.

Every simulated run ``i`` of step ``s`` draws, once, a uniform ``u`` and a standard normal ``z`` per attempt and per
sample slot, from a generator seeded by the seed and the step's id. A candidate choice reads the same draws
(sample ``j`` of attempt ``a`` succeeds when ``u < p_success`` of its tier and takes ``median * exp(sigma * z)``), so
two candidates are compared on the same luck and their difference is not sampling noise (common random numbers).
Pure Python, no I/O.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass

from planweave.allocate.model import Choice, StepOptions, TierProfile, TierTable


@dataclass(frozen=True, slots=True)
class Outcomes:
    """A step's simulated runs under one choice: per run, whether it succeeded, its seconds and its dollars."""

    ok: Sequence[bool]
    seconds: Sequence[float]
    usd: Sequence[float]

    @property
    def mean_usd(self) -> float:
        return sum(self.usd) / len(self.usd) if self.usd else 0.0


class Draws:
    """The random numbers of one step: ``sims`` runs x ``attempts`` x ``slots`` pairs ``(u, z)``, drawn once."""

    def __init__(self, seed: int, step: str, sims: int, attempts: int, slots: int) -> None:
        rng = random.Random(f"{seed}/{step}")
        self.attempts = attempts
        self.slots = slots
        count = sims * attempts * slots
        self.u = [rng.random() for _ in range(count)]
        self.z = [rng.gauss(0.0, 1.0) for _ in range(count)]


def attempt_outcome(profile: TierProfile, samples: int, select: str, u: Sequence[float], z: Sequence[float],
                    at: int) -> tuple[bool, float, float]:
    """One attempt of ``samples`` parallel calls at ``profile``, reading draws ``at .. at+samples-1``.

    ``vote`` succeeds when more than half the samples are valid, after the slowest; ``first_valid`` and
    ``verifier`` succeed with the first valid sample (the others are cancelled then and pay for the share of their
    call they ran, as a cut stream is billed for what it generated), or fail after the slowest.
    Returns ``(ok, seconds, usd)``.
    """
    p, median, sigma, cost = profile.p_success, profile.duration_s, profile.duration_sigma, profile.cost_usd
    valid = 0
    slowest = 0.0
    first = math.inf
    durations = []
    for j in range(at, at + samples):
        seconds = median * math.exp(sigma * z[j]) if sigma else median
        durations.append(seconds)
        slowest = max(slowest, seconds)
        if u[j] < p:
            valid += 1
            first = min(first, seconds)
    if select == "vote":
        return 2 * valid > samples, slowest, cost * samples
    if valid:  # the others are cut at that moment: each pays for the share of its call it ran
        return True, first, cost * sum(min(1.0, first / d) if d > 0 else 1.0 for d in durations)
    return False, slowest, cost * samples


def step_outcomes(step: StepOptions, choice: Choice | None, table: TierTable, draws: Draws | None,
                  sims: int) -> Outcomes:
    """What ``step`` does in each of ``sims`` runs under ``choice`` (None: a step the allocator does not choose for,
    which takes its fixed seconds and dollars and succeeds), every attempt it may still make included."""
    if choice is None or draws is None:
        seconds = max(0.0, step.fixed_s - step.elapsed_s)
        return Outcomes([True] * sims, [seconds] * sims, [step.fixed_usd] * sims)
    profile = (step.table or table)[choice.tier]
    ok: list[bool] = []
    secs: list[float] = []
    usd: list[float] = []
    per_run = draws.attempts * draws.slots
    for i in range(sims):
        total_s = total_usd = 0.0
        success = False
        for a in range(step.attempts):
            if a:
                total_s += step.backoff.delay(a)
            good, s, c = attempt_outcome(profile, choice.samples, step.select, draws.u, draws.z,
                                         i * per_run + a * draws.slots)
            total_s += s
            total_usd += c
            if good:
                success = True
                break
        ok.append(success)
        secs.append(max(0.0, total_s - step.elapsed_s))
        usd.append(total_usd)
    return Outcomes(ok, secs, usd)


def finish_times(order: Sequence[int], deps: Sequence[Sequence[int]], seconds: Sequence[Sequence[float]],
                 sims: int) -> list[list[float]]:
    """Per step (by index, in ``order``), per run: when it finishes if every step starts as its inputs exist."""
    finish: list[list[float]] = [[] for _ in seconds]
    for x in order:
        if not deps[x]:
            finish[x] = list(seconds[x])
        elif len(deps[x]) == 1:
            finish[x] = list(map(operator.add, seconds[x], finish[deps[x][0]]))
        else:
            starts = map(max, *(finish[p] for p in deps[x]))
            finish[x] = list(map(operator.add, seconds[x], starts))
    return finish


def tails(order: Sequence[int], succs: Sequence[Sequence[int]], seconds: Sequence[Sequence[float]],
          sims: int) -> list[list[float]]:
    """Per step, per run: the longest chain of seconds from the step (included) to the end of the plan."""
    tail: list[list[float]] = [[] for _ in seconds]
    for x in reversed(order):
        if not succs[x]:
            tail[x] = list(seconds[x])
        elif len(succs[x]) == 1:
            tail[x] = list(map(operator.add, seconds[x], tail[succs[x][0]]))
        else:
            tail[x] = list(map(operator.add, seconds[x], map(max, *(tail[s] for s in succs[x]))))
    return tail
