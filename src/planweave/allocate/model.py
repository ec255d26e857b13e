"""The allocator's data: model tiers and what a call at each costs, the remaining plan as the allocator sees it.

Pure data, no I/O: a :class:`TierTable` is declared (a file, a test, the bench) or derived from estimates; a
:class:`Problem` is the rest of a run (steps not yet finished, their dependencies, which of them the allocator may
choose for), the budget left and the seconds left; a :class:`Choice` is a tier and a number of parallel samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from planweave.models.endpoint import Endpoint, EndpointError

Select = Literal["vote", "first_valid", "verifier"]
"""How one result is picked from parallel samples: ``vote`` (the output more than half the samples agree on),
``first_valid`` (the first sample that passes the step's schema/check; the others are cancelled), ``verifier`` (the
first sample a named verifier accepts)."""

SELECTS: tuple[str, ...] = get_args(Select)
MAX_SAMPLES = 16
"""The most parallel samples one step may ask for (``samples: N`` or the allocator's choice)."""


MAX_TIERS = 32
"""The most tiers one table may hold (a file, a journaled run, a ``POST /runs`` request)."""


class AllocationError(ValueError):
    """A tier table or an ``llm`` step's allocation arguments are wrong; the message names the thing and where."""


@dataclass(frozen=True, slots=True)
class TierProfile:
    """One model tier: the model it names and, per call, P(valid result), duration (lognormal) and cost.

    ``duration_s`` is the median seconds of one call, ``duration_sigma`` the lognormal's sigma (0: fixed);
    ``cost_usd`` the expected dollars of one call, ``tokens`` its expected tokens; ``endpoint`` where its model is
    called (None: the run's endpoint; docs/models.md).
    """

    name: str
    model: str
    p_success: float
    duration_s: float
    cost_usd: float
    duration_sigma: float = 0.0
    tokens: int = 0
    endpoint: Endpoint | None = None

    def __post_init__(self) -> None:
        where = f"tier '{self.name}'"
        if not 0.0 <= self.p_success <= 1.0:
            raise AllocationError(f"{where}: p_success must be in [0, 1], got {self.p_success}")
        for label, value in (("duration_s", self.duration_s), ("cost_usd", self.cost_usd),
                             ("duration_sigma", self.duration_sigma), ("tokens", self.tokens)):
            if not value >= 0 or value == float("inf"):
                raise AllocationError(f"{where}: {label} must be a finite number >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class TierTable:
    """The tiers an ``llm`` step with ``model: auto`` may be given, by name."""

    tiers: Mapping[str, TierProfile]

    def __getitem__(self, name: str) -> TierProfile:
        try:
            return self.tiers[name]
        except KeyError:
            known = ", ".join(sorted(self.tiers)) or "none"
            raise AllocationError(f"unknown tier '{name}' (known tiers: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self.tiers

    def by_model(self, model: str) -> TierProfile | None:
        """The tier serving ``model`` (a step that names its model keeps it, with that tier's profile)."""
        for tier in self.tiers.values():
            if tier.model == model:
                return tier
        return None

    def to_mapping(self) -> dict[str, dict[str, Any]]:
        """The table as :meth:`from_mapping` reads it (JSON data: what ``run_created`` journals). A tier's endpoint
        keeps its base URL and the name of its key's variable, never a key nor the headers (given again on resume)."""
        return {name: {"model": t.model, "p_success": t.p_success, "duration_s": t.duration_s,
                       "cost_usd": t.cost_usd, "duration_sigma": t.duration_sigma, "tokens": t.tokens,
                       **(_journaled_endpoint(t.endpoint) if t.endpoint is not None else {})}
                for name, t in self.tiers.items()}

    def endpoints(self) -> dict[str, Endpoint]:
        """The endpoint of each model whose tier names one (model → endpoint)."""
        return {t.model: t.endpoint for t in self.tiers.values() if t.endpoint is not None}

    @classmethod
    def from_mapping(cls, doc: Any, *, where: str = "tiers") -> TierTable:
        """Build a table from ``{name: {model, p_success, duration_s, cost_usd, duration_sigma?, tokens?}}``.

        Raises :class:`AllocationError` naming ``where``, the tier and the field for anything missing or wrong.
        """
        if not isinstance(doc, Mapping) or not doc:
            raise AllocationError(f"{where}: expected a mapping of tier names to their profiles")
        if len(doc) > MAX_TIERS:
            raise AllocationError(f"{where}: {len(doc)} tiers, more than the {MAX_TIERS} a table may hold")
        tiers: dict[str, TierProfile] = {}
        fields = ("model", "p_success", "duration_s", "cost_usd", "duration_sigma", "tokens", "base_url",
                  "api_key_env", "headers")
        for name, spec in doc.items():
            at = f"{where}: tier '{name}'"
            if not isinstance(spec, Mapping):
                raise AllocationError(f"{at}: expected a mapping, got {type(spec).__name__}")
            unknown = sorted(set(spec) - set(fields))
            if unknown:
                raise AllocationError(f"{at}: unknown field '{unknown[0]}' (fields: {', '.join(fields)})")
            for required in fields[:4]:
                if required not in spec:
                    raise AllocationError(f"{at}: missing field '{required}'")
            if not isinstance(spec["model"], str) or not spec["model"].strip():
                raise AllocationError(f"{at}: field 'model' must be a model name, got {spec['model']!r}")
            try:
                tiers[str(name)] = TierProfile(
                    name=str(name), model=str(spec["model"]), p_success=_number(spec["p_success"], at, "p_success"),
                    duration_s=_number(spec["duration_s"], at, "duration_s"),
                    cost_usd=_number(spec["cost_usd"], at, "cost_usd"),
                    duration_sigma=_number(spec.get("duration_sigma", 0.0), at, "duration_sigma"),
                    tokens=int(_number(spec.get("tokens", 0), at, "tokens")),
                    endpoint=_tier_endpoint(spec, at),
                )
            except AllocationError as exc:
                raise AllocationError(f"{where}: {exc}") from None
        served: dict[str, Endpoint | None] = {}
        for tier in tiers.values():  # a model is one client: the tiers naming it share its endpoint
            if served.setdefault(tier.model, tier.endpoint) != tier.endpoint:
                raise AllocationError(f"{where}: tier '{tier.name}': model '{tier.model}' is on another endpoint in "
                                      "another tier (the tiers naming one model share its endpoint)")
        return cls(tiers)


def _tier_endpoint(spec: Mapping[str, Any], at: str) -> Endpoint | None:
    parts = {k: spec[k] for k in ("base_url", "api_key_env", "headers") if spec.get(k) is not None}
    if not parts:
        return None
    try:
        return Endpoint.from_mapping(parts, where=at)
    except EndpointError as exc:
        raise AllocationError(str(exc)) from None


def _journaled_endpoint(endpoint: Endpoint) -> dict[str, Any]:
    record = endpoint.journaled()
    record.pop("header_names", None)  # from_mapping reads headers with their values: a resume gives them again
    return record


def _number(value: Any, at: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AllocationError(f"{at}: field '{name}' must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True, order=True)
class Choice:
    """A tier and the number of parallel samples one step's model call gets."""

    tier: str
    samples: int = 1


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delays between a step's attempts (its retry policy without jitter): ``backoff * factor**n``, capped."""

    backoff: float = 0.5
    factor: float = 2.0
    max_backoff: float = 60.0

    def delay(self, retry: int) -> float:
        return min(self.max_backoff, self.backoff * self.factor ** (retry - 1))


@dataclass(frozen=True, slots=True)
class StepOptions:
    """One step of the remaining plan as the allocator sees it.

    ``tiers`` and ``samples`` are the candidates (empty ``tiers``: not a model step; its ``fixed_s`` and
    ``fixed_usd`` are what it takes). ``chosen`` pins the choice (a running step, or a step that named its model).
    ``attempts`` counts the attempts it may still make (retries left + 1); ``elapsed_s`` how long a running step has
    run already. ``table``, when set, replaces the allocator's table for this step.
    """

    id: str
    deps: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()
    samples: tuple[int, ...] = (1,)
    select: Select = "first_valid"
    attempts: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    chosen: Choice | None = None
    elapsed_s: float = 0.0
    fixed_s: float = 0.0
    fixed_usd: float = 0.0
    table: TierTable | None = None  # this step's own profiles of the tiers (a hard step fails more often)

    @property
    def free(self) -> bool:
        """Whether the allocator chooses for this step."""
        return self.chosen is None and bool(self.tiers)

    def candidates(self) -> list[Choice]:
        if self.chosen is not None:
            return [self.chosen]
        return [Choice(t, k) for t in self.tiers for k in self.samples]


@dataclass(frozen=True, slots=True)
class Problem:
    """The rest of a run: steps in dependency order (each after its ``deps``), the dollars and seconds left."""

    steps: tuple[StepOptions, ...]
    budget_usd: float | None = None
    deadline_s: float | None = None

    def step(self, step_id: str) -> StepOptions:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise AllocationError(f"step '{step_id}' is not in the remaining plan")


@dataclass(frozen=True, slots=True)
class Estimate:
    """What Monte Carlo says of an allocation: P(all steps succeed), P(within budget), P(within deadline), P(all
    three), expected dollars and seconds."""

    p_all: float
    p_success: float
    p_budget: float
    p_deadline: float
    cost_usd: float
    makespan_s: float

    def to_json(self) -> dict[str, float]:
        return {"p_all": round(self.p_all, 4), "p_success": round(self.p_success, 4),
                "p_budget": round(self.p_budget, 4), "p_deadline": round(self.p_deadline, 4),
                "cost_usd": round(self.cost_usd, 6), "makespan_s": round(self.makespan_s, 3)}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One choice compared for the step decided: its estimate with the rest of the plan allocated, and whether its
    reserved worst case fits the budget left now."""

    choice: Choice
    estimate: Estimate
    fits: bool

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.choice.tier, "samples": self.choice.samples, "fits": self.fits,
                **self.estimate.to_json()}


@dataclass(frozen=True, slots=True)
class Decision:
    """The allocator's answer for one step: its choice, the whole plan's allocation, the estimate, what was compared."""

    step: str
    choice: Choice
    plan: Mapping[str, Choice]
    estimate: Estimate
    compared: Sequence[Candidate]
    sims: int
    policy: str
    overhead_s: float = 0.0
    reason: str = ""
