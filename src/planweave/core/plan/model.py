"""The plan model: steps, retry policies and immutable, versioned plans (pure data, no I/O)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

STEP_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]*$"


def normalise_resource(name: str) -> str:
    """The canonical name of a read/write resource: paths are normalised lexically (``./a/../b`` is ``b``)."""
    if not name.strip():
        raise ValueError("a resource name cannot be empty")
    return posixpath.normpath(name) if "/" in name or name.startswith(".") else name

ErrorKind = str
"""A failure classification: ``timeout``, ``error`` (the tool raised), ``output`` (unserialisable result),
``exit_code`` (shell), or the class name of the exception a tool raised (e.g. ``ConnectionError``)."""


MAX_SECONDS = 1e12
"""The largest duration a plan may state (about 31,700 years, room for the longest AsyncHow plans): larger values,
Infinity and NaN are refused, so every timer the engine arms is a finite, representable deadline."""

MAX_COST = 1e9
"""The largest cost estimate (USD) a plan may state."""


def _seconds(default: float | None, description: str, *, ge: float | None = None, gt: float | None = None) -> Any:
    """A field of finite seconds in ``[ge or gt, MAX_SECONDS]``."""
    return Field(default, ge=ge, gt=gt, le=MAX_SECONDS, allow_inf_nan=False, description=description)


def _retries_shorthand(value: Any) -> Any:
    """``retries: 3`` is ``retries: {max: 3}``; booleans are refused (``True`` is not a count)."""
    if isinstance(value, bool):
        raise ValueError("must be a count or a retry policy object")
    if isinstance(value, int):
        return {"max": value}
    return value


class _Frozen(BaseModel):
    # defer_build: the validators are built when a plan is first read, not at import: the commands that never read
    # one (--help, runs, approve, send, cancel, tools) skip it (docs/benchmarks.md, "CLI start-up").
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class RetryPolicy(_Frozen):
    """How often a step is retried and how long to wait between attempts.

    The delay before retry ``n`` (1-based) is ``min(max_backoff, backoff * factor**(n-1))``, then multiplied by a
    random factor in ``[1 - jitter, 1 + jitter]`` drawn from a generator seeded by run and step, so runs replay.
    """

    max: int = Field(0, ge=0, le=1000, description="Retries after the first attempt.")
    backoff: float = _seconds(0.5, "Delay before the first retry, seconds.", ge=0)
    factor: float = Field(2.0, ge=1, le=1000, allow_inf_nan=False, description="Multiplier per further retry.")
    max_backoff: float = _seconds(60.0, "Upper bound of one delay, seconds.", ge=0)
    jitter: float = Field(0.1, ge=0, le=1, allow_inf_nan=False, description="Relative spread of the random factor.")
    on: tuple[ErrorKind, ...] = Field(
        ("timeout", "error"),
        description="Error kinds that are retried; 'error' matches any exception a tool raises.",
    )

    def delay(self, retry: int, unit_random: float) -> float:
        """Return the delay before retry number ``retry`` (1-based) given a uniform sample in [0, 1)."""
        try:
            grown = self.backoff * self.factor ** (retry - 1)
        except OverflowError:  # factor**999 exceeds a float: the cap applies
            grown = self.max_backoff
        base = min(self.max_backoff, grown)
        return max(0.0, base * (1.0 + self.jitter * (2.0 * unit_random - 1.0)))

    def retries_on(self, kind: ErrorKind, exception_names: tuple[str, ...] = ()) -> bool:
        """Whether a failure of ``kind`` (raised as one of ``exception_names``) is retried.

        ``error`` in ``on`` matches every kind except ``timeout`` and the kinds that no retry can fix
        (bad arguments, a bad reference, an unserialisable output).
        """
        if kind in self.on or any(name in self.on for name in exception_names):
            return True
        return "error" in self.on and kind not in NEVER_RETRIED and kind != "timeout"


NEVER_RETRIED = frozenset({"output", "reference", "arguments", "exit", "interrupted"})
"""Kinds that ``error`` in a retry policy does not match: retried only when ``on`` names them."""


NO_RETRIES = RetryPolicy.model_construct()  # the defaults, without building the validator at import


class Estimate(_Frozen):
    """What a step is expected to take: seconds of wall time and cost in USD."""

    duration: float = _seconds(0.0, "Expected seconds of wall time.", ge=0)
    cost: float = Field(0.0, ge=0, le=MAX_COST, allow_inf_nan=False, description="Expected cost, USD.")


class Fallback(_Frozen):
    """Another way to do a step, tried once when the step fails for good (after its retries)."""

    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


StepExecutor = Literal["local", "ray"]
"""Where a step's tool call runs when the step says so: the engine's own process, or a Ray task."""


class CacheSpec(_Frozen):
    """A step's ``cache: {ttl: S}``: reuse a finished output of the same tool and arguments no older than ``ttl``."""

    ttl: float | None = _seconds(None, "Seconds a cached output stays usable; unset: no limit.", gt=0)


class Step(_Frozen):
    """One tool call in a plan. ``args`` may contain ``${step}`` / ``${step.path[0]}`` references."""

    id: str = Field(pattern=STEP_ID_PATTERN, max_length=200)
    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    after: tuple[str, ...] = ()
    retries: RetryPolicy = NO_RETRIES
    timeout: float | None = _seconds(
        None, "Seconds per attempt; unset takes the plan's default, null means no limit.", gt=0
    )
    heartbeat: float | None = _seconds(
        None, "Seconds the tool may go without a heartbeat before it is treated as hung.", gt=0
    )
    resources: dict[str, int] = Field(default_factory=dict)
    reads: tuple[str, ...] = Field((), description="Resources (names or paths) read: readers run together.")
    writes: tuple[str, ...] = Field((), description="Resources (names or paths) written: a writer runs alone.")
    estimate: Estimate | None = None
    idempotent: bool | None = Field(None, description="Defaults to the tool's own setting.")
    description: str = ""
    fallback: Fallback | None = Field(None, description="Tried once when the step fails after its retries.")
    observe: bool = Field(False, description="The result is an observation: the planner re-plans when it arrives.")
    predict: Any = Field(
        None, description="The output this step is expected to give (any JSON value; null: no prediction): steps "
        "that need it may start on it speculatively and are kept only if it was right (docs/speculation.md).",
    )
    verifies: str | None = Field(
        None, description="This step checks step VERIFIES; an output {ok: false, reason} triggers a re-plan."
    )
    approval: bool | str | None = Field(
        None, description="The step waits for a person's approval before it runs; a text is shown to the approver."
    )
    isolation: Literal["thread", "process"] | None = Field(
        None, description="How a synchronous Python tool runs: in a worker thread or a child process."
    )
    executor: StepExecutor | None = Field(
        None, description="Where the tool call runs: 'ray' (a Ray task) or 'local' (the engine's process); unset: "
        "the engine's executor decides.",
    )
    optional: bool = Field(
        False, description="The run may do without this step: under deadline pressure (a plan's pressure:, "
        "--deadline-pressure) it is cancelled, unless a step that is not optional needs it.",
    )

    cache: bool | CacheSpec | None = Field(
        None, description="Reuse a finished output of the same tool and arguments from an earlier run of the journal "
        "(idempotent steps only): true, {ttl: S}, or false to never; unset: the tool's own setting (docs/caching.md).",
    )

    @field_validator("retries", mode="before")
    @classmethod
    def _retries_shorthand(cls, value: Any) -> Any:
        return _retries_shorthand(value)

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_option(cls, value: Any) -> Any:
        """One message for a bad ``cache:`` (a union would report a mismatch with ``bool`` as well)."""
        if value is None or isinstance(value, bool | CacheSpec):
            return value
        if not isinstance(value, Mapping):
            raise ValueError("must be true, false or {ttl: seconds}")
        try:
            return CacheSpec.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            if first["type"] == "extra_forbidden":
                raise ValueError(f"has no option '{where}' (only ttl)") from None
            raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None

    @field_validator("approval")
    @classmethod
    def _approval_text(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must be true or a non-empty text shown to the approver")
        return value

    @field_validator("resources")
    @classmethod
    def _positive_claims(cls, value: dict[str, int]) -> dict[str, int]:
        for name, amount in value.items():
            if amount < 1:
                raise ValueError(f"claim on '{name}' must be at least 1, got {amount}")
        return value

    @field_validator("reads", "writes")
    @classmethod
    def _normalise_resources(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(normalise_resource(v) for v in value))

    @property
    def duration_estimate(self) -> float:
        return self.estimate.duration if self.estimate else 0.0


SpeculationMode = Literal["off", "safe", "eager"]
"""``off``: no speculation; ``safe``: a step may start on the predicted outputs of the steps it needs; ``eager``:
also on the outputs of speculative attempts (chains of speculation), see docs/speculation.md."""


class PredictorSpec(_Frozen):
    """A cheap model asked to predict a running producer's output (``speculation: {predictor: ...}``): its calls
    count as speculation's extra cost, within ``max_extra_cost_usd`` and the run's budget (docs/speculation.md)."""

    model: str = Field(min_length=1, max_length=200, description="The predictor's model name.")
    base_url: str | None = Field(None, max_length=2000, description="Its OpenAI-compatible endpoint (default: the "
                                 "run's --base-url, else $OPENAI_BASE_URL).")
    max_tokens: int = Field(256, ge=1, le=100_000, description="Most tokens of one prediction.")


class SpeculationSpec(_Frozen):
    """How far a run may speculate: a step safe to throw away starts before its inputs exist, on predicted ones."""

    mode: SpeculationMode = Field("safe", description="off, safe (one level) or eager (chains).")
    max_parallel: int = Field(4, ge=1, le=10_000, description="Speculative attempts in flight at once, at most.")
    max_extra_cost_usd: float = Field(
        0.0, ge=0, le=MAX_COST, allow_inf_nan=False,
        description="The cost, USD, that speculative work may add (discarded attempts, and those in flight at "
        "their estimate) before no more starts; 0: only steps estimated to cost nothing speculate.",
    )
    min_confidence: float = Field(
        0.5, ge=0, le=1, allow_inf_nan=False,
        description="The least confidence a prediction needs (a chain's is the product of its links').",
    )
    predictor: PredictorSpec | None = Field(
        None, description="A cheap model that predicts producers' outputs (its cost is speculation's extra cost).")


class StepDefaults(_Frozen):
    """Values a plan gives the steps that do not set their own ``timeout``, ``retries`` or ``heartbeat``.

    A key left out here leaves the step's value unset; ``timeout: null`` written here means "no limit".
    """

    timeout: float | None = _seconds(None, "Seconds per attempt for steps without their own timeout.", gt=0)
    retries: RetryPolicy | None = Field(None, description="Retries (a count or a policy) for steps without their own.")
    heartbeat: float | None = _seconds(None, "Heartbeat interval for steps without their own.", gt=0)

    @field_validator("retries", mode="before")
    @classmethod
    def _retries_shorthand(cls, value: Any) -> Any:
        return _retries_shorthand(value)


PressureAction = Literal["faster_tiers", "drop_optional", "replan"]
"""What deadline pressure does: the fastest tiers for the remaining ``model: auto`` steps, cancel the optional steps,
re-plan a goal run with the time left in the prompt (docs/allocation.md, "Deadline pressure")."""

PRESSURE_ACTIONS: tuple[PressureAction, ...] = ("faster_tiers", "drop_optional", "replan")


class DeadlinePressure(_Frozen):
    """When the run's forecast gives it less than ``p_deadline`` chance to finish in time, do ``actions`` (once
    per crossing of the threshold)."""

    p_deadline: float = Field(0.5, gt=0, le=1, allow_inf_nan=False,
                              description="The forecast's P(in time) below which the actions are taken.")
    actions: tuple[PressureAction, ...] = Field(PRESSURE_ACTIONS, min_length=1,
                                                description="What to do, in this order.")

    @field_validator("actions")
    @classmethod
    def _distinct(cls, value: tuple[PressureAction, ...]) -> tuple[PressureAction, ...]:
        twice = sorted({a for a in value if value.count(a) > 1})
        if twice:
            raise ValueError(f"names '{twice[0]}' more than once")
        return value


class PlanSpec(_Frozen):
    """A plan as written in a plan file: the steps plus optional defaults for running it."""

    steps: tuple[Step, ...]
    name: str = ""
    goal: str = ""
    capacities: dict[str, int] = Field(default_factory=dict)
    concurrency: int | None = Field(None, ge=1)
    speculation: SpeculationSpec | None = Field(
        None, description="Start steps on predicted inputs (docs/speculation.md); unset: no speculation.")
    on_failure: Literal["stop", "continue"] | None = Field(
        None, description="After a step fails for good: stop the run, or continue with what does not depend on it."
    )
    defaults: StepDefaults = Field(default_factory=StepDefaults, description="Defaults for the steps.")
    pressure: DeadlinePressure | None = Field(
        None, description="Deadline pressure: what the run does when its forecast says it will likely be late.")
    cache: bool = Field(True, description="false: no step of this plan reuses a cached output (docs/caching.md).")
    schema_: str | None = Field(None, alias="$schema")

    def shown_name(self) -> str | None:
        """What a run of this plan is listed as: its name, else (a goal run's) its goal on one line, cut to
        :data:`SHOWN_GOAL_CHARS`; None for neither."""
        if self.name:
            return self.name
        goal = " ".join(self.goal.split())
        if len(goal) > SHOWN_GOAL_CHARS:
            goal = goal[: SHOWN_GOAL_CHARS - 1].rstrip() + "…"
        return goal or None


SHOWN_GOAL_CHARS = 60  # of a goal shown as its run's name (runs, show, GET /runs)


StepStatus = Literal["pending", "ready", "running", "succeeded", "failed", "cancelled", "skipped", "unknown",
                     "waiting_approval", "waiting_input"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "skipped"})


class Claim(NamedTuple):
    """What a step holds while it runs: amounts of capacities, and resources it reads or writes."""

    amounts: Mapping[str, int]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def names(self) -> set[str]:
        return {*self.amounts, *self.reads, *self.writes}
