"""Estimates from history: fitted distributions of what steps take, per tool, model and step fingerprint (pure).

An :class:`Observation` is one finished attempt (or one model call): its duration, whether it succeeded, its tokens
and cost. :func:`fit` turns the observations of one key into an :class:`Estimate`: a duration distribution (a
lognormal fitted by maximum likelihood once there are :data:`LOGNORMAL_MIN` positive samples, the samples themselves
below that), a success rate as a Beta posterior, and mean tokens and cost per attempt. :class:`Estimates` is the table
of them; :meth:`Estimates.step_model` combines a step's history (its fingerprint where it repeats, else its tool)
with the plan's own ``estimate:`` as a prior, into the :class:`StepModel` the simulator samples from.

Success is pooled (:class:`Pooled`): a step's rate is its fingerprint's outcomes shrunk towards its tool's, the tool's
towards every attempt's in the history, each level's prior worth :data:`POOL_WEIGHT` observations; first attempts
and retries are pooled apart, so a step that fails once by design and succeeds on its retry reads as one that
succeeds, not as a coin toss per attempt. With no outcome in the history at all, success is unknown (said so, never
taken as certain).

Nothing here reads a journal (``forecast/history.py`` does): the table is derived data, recomputed from the journal.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planweave.core.plan.model import Step

LOGNORMAL_MIN = 8
"""Positive duration samples needed before a lognormal is fitted; fewer are sampled as they are (empirical)."""

PRIOR_WEIGHT = 2.0
"""How many observations the plan's ``estimate:`` counts as, against a step's history."""

POOL_WEIGHT = 2.0
"""How many observations a level's pooled rate counts as, as the prior of the level below (global → tool → step)."""

LITERAL_DURATIONS: Mapping[str, str] = {"sleep": "seconds"}
"""Tools whose duration is an argument: a step that gives it literally takes that long (``sleep: seconds``)."""

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
    retry: bool = False  # a step's second or later attempt (its retries are pooled apart from first attempts)


@dataclass(frozen=True)
class Outcomes:
    """Successes and failures of first attempts and of retries, for one key or the whole history."""

    first_ok: int = 0
    first_failed: int = 0
    retry_ok: int = 0
    retry_failed: int = 0

    def plus(self, o: Observation) -> Outcomes:
        if o.retry:
            return Outcomes(self.first_ok, self.first_failed, self.retry_ok + o.ok, self.retry_failed + (not o.ok))
        return Outcomes(self.first_ok + o.ok, self.first_failed + (not o.ok), self.retry_ok, self.retry_failed)

    @property
    def n(self) -> int:
        return self.first_ok + self.first_failed + self.retry_ok + self.retry_failed


def _shrunk(ok: int, failed: int, prior: float) -> float:
    """The posterior mean of a rate seen ``ok``/``failed`` times, with ``prior`` worth :data:`POOL_WEIGHT` outcomes."""
    return (ok + POOL_WEIGHT * prior) / (ok + failed + POOL_WEIGHT)


@dataclass(frozen=True)
class Pooled:
    """Success rates pooled over levels: every attempt in the history, each tool, each step fingerprint.

    The history's own rate is its first attempts' Beta posterior (``prior``, default uniform: Laplace's rule;
    retries: shrunk towards it). A tool's rate is
    its outcomes with the history's rate as a prior worth :data:`POOL_WEIGHT` observations, a fingerprint's with its
    tool's. A tool that never failed in 20 attempts reads near certain, one that fails half its first attempts reads
    so, and a step's own record moves it from there."""

    overall: Outcomes = Outcomes()
    tools: Mapping[str, Outcomes] = field(default_factory=dict)
    steps: Mapping[str, Outcomes] = field(default_factory=dict)
    prior: tuple[float, float] = (1.0, 1.0)  # the history's own Beta prior (uniform: Laplace's rule)

    @property
    def known(self) -> bool:
        """Whether the history holds any outcome (else success is unknown)."""
        return self.overall.n > 0

    def rates(self, tool: str, fingerprint: str | None) -> tuple[float, float]:
        """The chance that a first attempt and that a retry of a step (``fingerprint``, run as ``tool``) succeed."""
        o = self.overall
        a, b = self.prior
        first = (o.first_ok + a) / (o.first_ok + o.first_failed + a + b)
        retry = _shrunk(o.retry_ok, o.retry_failed, first)
        for level in (self.tools.get(tool), self.steps.get(fingerprint) if fingerprint is not None else None):
            if level is not None:
                first = _shrunk(level.first_ok, level.first_failed, first)
                retry = _shrunk(level.retry_ok, level.retry_failed, retry)
        return first, retry


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
    p_retry: float | None = None  # a retry's chance of success (None: as a first attempt's)
    timed: bool = True  # whether its duration comes from anything (history, estimate:, a literal argument)

    def sample_duration(self, rng: random.Random) -> float:
        if self.prior_share > 0.0 and rng.random() < self.prior_share:
            return self.prior_duration
        return self.duration.sample(rng)




def literal_duration(step: Step, tool: str) -> float | None:
    """The seconds ``step`` takes by its arguments (:data:`LITERAL_DURATIONS`: ``sleep`` with literal ``seconds``)."""
    arg = LITERAL_DURATIONS.get(tool)
    value = step.args.get(arg) if arg is not None else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


@dataclass(frozen=True)
class Estimates:
    """The table of estimates, keyed by ``(kind, name)``; derived from a journal, never its source of truth."""

    table: Mapping[tuple[KeyKind, str], Estimate] = field(default_factory=dict)
    min_step_samples: int = 2  # a fingerprint's own history is used once it repeats this often
    pooled: Pooled = field(default_factory=Pooled)

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

        Durations: a literal one (``sleep``'s ``seconds``) is exact; else the history's, with the plan's estimate
        counted as :data:`PRIOR_WEIGHT` observations (without history the estimate is taken as exact); with none of
        these the step is untimed (``timed`` False: instant, and said so). Success: the pooled rates of first
        attempts and retries (:class:`Pooled`); certain when the history holds no outcome at all (the forecast then
        says success is unknown). The mean cost is the estimate's and the history's, weighted likewise.
        """
        declared = step.estimate if tool is None else None
        runs_as = tool or step.tool
        found = self.history_of(step, fingerprint, tool)
        first, retry = (self.pooled.rates(runs_as, fingerprint if tool is None else None) if self.pooled.known
                        else (1.0, 1.0))
        literal = literal_duration(step, runs_as) if tool is None else None
        if found is None:
            value = literal if literal is not None else declared.duration if declared else 0.0
            return StepModel(Duration("fixed", value=value), first, declared.cost if declared else 0.0,
                             p_retry=retry, timed=literal is not None or declared is not None)
        duration = found.duration if literal is None else Duration("fixed", value=literal)
        if declared is None:
            return StepModel(duration, first, found.cost_usd, p_retry=retry)
        share = PRIOR_WEIGHT / (PRIOR_WEIGHT + found.n)
        cost = share * declared.cost + (1.0 - share) * found.cost_usd
        if literal is not None:
            return StepModel(duration, first, cost, p_retry=retry)
        return StepModel(duration, first, cost, prior_share=share, prior_duration=declared.duration, p_retry=retry)


def build_estimates(observations: Iterable[Observation], prior: tuple[float, float] = (1.0, 1.0)) -> Estimates:
    """Group ``observations`` by key and :func:`fit` each group; pool their outcomes (:class:`Pooled`)."""
    groups: dict[tuple[KeyKind, str], list[Observation]] = {}
    overall = Outcomes()
    tools: dict[str, Outcomes] = {}
    steps: dict[str, Outcomes] = {}
    for o in observations:
        groups.setdefault((o.kind, o.name), []).append(o)
        if o.kind == "tool":
            overall = overall.plus(o)
            tools[o.name] = tools.get(o.name, Outcomes()).plus(o)
        elif o.kind == "step":
            steps[o.name] = steps.get(o.name, Outcomes()).plus(o)
    return Estimates({key: fit(key[0], key[1], obs, prior) for key, obs in groups.items()},
                     pooled=Pooled(overall, tools, steps, prior))
