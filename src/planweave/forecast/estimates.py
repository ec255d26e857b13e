"""Estimates from history: fitted distributions of what steps take, per tool, model and step fingerprint (pure).

An :class:`Observation` is one finished attempt (or one model call): its duration, whether it succeeded, its tokens
and cost. :func:`fit` turns the observations of one key into an :class:`Estimate`: a duration distribution (a
lognormal fitted by maximum likelihood once there are :data:`LOGNORMAL_MIN` positive samples, the samples themselves
below that), a success rate as a Beta posterior, and mean tokens and cost per attempt. :class:`Estimates` is the table
of them; :meth:`Estimates.step_model` combines a step's history (its fingerprint where it repeats, else its tool)
with the plan's own ``estimate:`` as a prior, into the :class:`StepModel` the simulator samples from.

Nothing here reads a journal (``forecast/history.py`` does): the table is derived data, recomputed from the journal.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planweave.plan.model import Step

LOGNORMAL_MIN = 8
"""Positive duration samples needed before a lognormal is fitted; fewer are sampled as they are (empirical)."""

PRIOR_WEIGHT = 2.0
"""How many observations the plan's ``estimate:`` counts as, against a step's history."""

KeyKind = Literal["tool", "model", "step"]


@dataclass(frozen=True)
class Observation:
    """One finished attempt of a step (``tool``, ``step``: its fingerprint) or one model call (``model``)."""

    kind: KeyKind
    name: str
    duration: float
    ok: bool
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    label: str = ""  # for people: a step fingerprint's step id and tool


@dataclass(frozen=True)
class BetaRate:
    """A success rate as a Beta(``alpha``, ``beta``) posterior: the prior's pseudo-counts plus the outcomes seen."""

    alpha: float
    beta: float

    @property
    def mean(self) -> float:
        """The posterior mean: the probability that the next attempt succeeds."""
        return self.alpha / (self.alpha + self.beta)

    @classmethod
    def posterior(cls, successes: int, failures: int, prior: tuple[float, float] = (1.0, 1.0)) -> BetaRate:
        """Beta(prior) updated with ``successes`` and ``failures`` (default prior: uniform, Laplace's rule)."""
        return cls(prior[0] + successes, prior[1] + failures)


@dataclass(frozen=True)
class Duration:
    """A distribution of seconds: ``lognormal`` (``mu``, ``sigma`` of the log), ``empirical`` (``samples``) or
    ``fixed`` (``value``)."""

    kind: Literal["lognormal", "empirical", "fixed"]
    mu: float = 0.0
    sigma: float = 0.0
    samples: tuple[float, ...] = ()
    value: float = 0.0

    def sample(self, rng: random.Random) -> float:
        """One draw."""
        if self.kind == "lognormal":
            return math.exp(self.mu + self.sigma * rng.gauss())  # gauss: about twice as fast as lognormvariate
        if self.kind == "empirical":
            return self.samples[int(rng.random() * len(self.samples))]
        return self.value

    @property
    def mean(self) -> float:
        if self.kind == "lognormal":
            return math.exp(self.mu + self.sigma * self.sigma / 2.0)
        if self.kind == "empirical":
            return sum(self.samples) / len(self.samples)
        return self.value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "mean": self.mean}
        if self.kind == "lognormal":
            out.update(mu=self.mu, sigma=self.sigma, median=math.exp(self.mu))
        elif self.kind == "empirical":
            ordered = sorted(self.samples)
            out.update(n=len(ordered), min=ordered[0], max=ordered[-1])
        else:
            out["value"] = self.value
        return out


def fit_duration(samples: Sequence[float]) -> Duration:
    """The lognormal of ``samples`` by maximum likelihood (mean and standard deviation of their logs) when there
    are at least :data:`LOGNORMAL_MIN` and all are positive; else the samples themselves (``empirical``)."""
    if not samples:
        raise ValueError("fit_duration needs at least one sample")
    if len(samples) >= LOGNORMAL_MIN and min(samples) > 0:
        logs = [math.log(s) for s in samples]
        mu = sum(logs) / len(logs)
        sigma = math.sqrt(sum((x - mu) ** 2 for x in logs) / len(logs))
        return Duration("lognormal", mu=mu, sigma=sigma)
    return Duration("empirical", samples=tuple(samples))


@dataclass(frozen=True)
class Estimate:
    """What the history says of one key (a tool, a model, a step fingerprint): per attempt or call."""

    kind: KeyKind
    name: str
    n: int
    duration: Duration
    success: BetaRate
    tokens_in: float
    tokens_out: float
    cost_usd: float
    label: str = ""  # a step fingerprint's latest step id and tool

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "name": self.name, "label": self.label or self.name, "n": self.n,
            "duration": self.duration.to_json(),
            "success": {"alpha": self.success.alpha, "beta": self.success.beta, "mean": self.success.mean},
            "tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "cost_usd": self.cost_usd,
        }


def fit(kind: KeyKind, name: str, observations: Sequence[Observation],
        prior: tuple[float, float] = (1.0, 1.0)) -> Estimate:
    """The :class:`Estimate` of one key from its observations (at least one)."""
    n = len(observations)
    ok = sum(1 for o in observations if o.ok)
    return Estimate(
        kind, name, n, fit_duration([o.duration for o in observations]), BetaRate.posterior(ok, n - ok, prior),
        sum(o.tokens_in for o in observations) / n, sum(o.tokens_out for o in observations) / n,
        sum(o.cost_usd for o in observations) / n, observations[-1].label,
    )


@dataclass(frozen=True)
class StepModel:
    """What the simulator samples for one step's attempt: a duration, success with ``p_success``, a cost."""

    duration: Duration
    p_success: float
    cost_usd: float
    prior_share: float = 0.0  # with both a prior and a history: the chance that a draw is the prior's duration
    prior_duration: float = 0.0

    def sample_duration(self, rng: random.Random) -> float:
        if self.prior_share > 0.0 and rng.random() < self.prior_share:
            return self.prior_duration
        return self.duration.sample(rng)




@dataclass(frozen=True)
class Estimates:
    """The table of estimates, keyed by ``(kind, name)``; derived from a journal, never its source of truth."""

    table: Mapping[tuple[KeyKind, str], Estimate] = field(default_factory=dict)
    min_step_samples: int = 2  # a fingerprint's own history is used once it repeats this often

    def get(self, kind: KeyKind, name: str) -> Estimate | None:
        return self.table.get((kind, name))

    def rows(self, kind: KeyKind | None = None, name: str | None = None) -> list[Estimate]:
        """The estimates of ``kind`` (and ``name``), by kind then name."""
        return [e for (k, n), e in sorted(self.table.items())
                if (kind is None or k == kind) and (name is None or n == name)]

    def history_of(self, step: Step, fingerprint: str | None, tool: str | None = None) -> Estimate | None:
        """The history that speaks for ``step`` (run as ``tool``, default its own): its fingerprint's if it repeats,
        else its tool's, else none."""
        if fingerprint is not None and tool is None:
            own = self.get("step", fingerprint)
            if own is not None and own.n >= self.min_step_samples:
                return own
        return self.get("tool", tool or step.tool)

    def step_model(self, step: Step, fingerprint: str | None = None, *, tool: str | None = None) -> StepModel:
        """The distribution of one attempt of ``step`` (``tool``: its fallback's), with ``estimate:`` as a prior.

        Without history the plan's estimate is taken as exact (a fixed duration, certain success). With history,
        the estimate counts as :data:`PRIOR_WEIGHT` observations: durations are drawn from it with that share, the
        mean cost is weighted likewise, and the success rate is the history's Beta posterior.
        """
        declared = step.estimate if tool is None else None
        found = self.history_of(step, fingerprint, tool)
        if found is None:
            value = declared.duration if declared else 0.0
            return StepModel(Duration("fixed", value=value), 1.0, declared.cost if declared else 0.0)
        if declared is None:
            return StepModel(found.duration, found.success.mean, found.cost_usd)
        share = PRIOR_WEIGHT / (PRIOR_WEIGHT + found.n)
        cost = share * declared.cost + (1.0 - share) * found.cost_usd
        return StepModel(found.duration, found.success.mean, cost, prior_share=share,
                         prior_duration=declared.duration)


def build_estimates(observations: Iterable[Observation], prior: tuple[float, float] = (1.0, 1.0)) -> Estimates:
    """Group ``observations`` by key and :func:`fit` each group."""
    groups: dict[tuple[KeyKind, str], list[Observation]] = {}
    for o in observations:
        groups.setdefault((o.kind, o.name), []).append(o)
    return Estimates({key: fit(key[0], key[1], obs, prior) for key, obs in groups.items()})
