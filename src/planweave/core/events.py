"""Events: every state change of a run, as appended to the journal (pure data).

An event's ``data`` is a plain JSON object, journaled as it is. What it holds for each kind is written down as a
``TypedDict`` below (``<Kind>Data``): dictionaries at run time, so the journaled form is unchanged and building one
costs nothing extra on the engine's hot path; checked by mypy where the fold reads them (``engine/state.py`` hands
each kind's handler its payload type through one dispatch table, ``PAYLOADS`` names the type of every kind).
Keys marked ``NotRequired`` may be missing: older journals lack them, or the writer leaves them out.

``EventKind`` and ``PAYLOADS`` hold the engine's kinds only. A journal stores any kind string: products built beside
the engine on the same journals declare their own kinds in their own modules (``planweave.control.events``), and
``Event.kind`` is a ``str`` so that their events, and the events read back from a journal, are typed as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict

EventKind = Literal[
    "run_created",  # data: plan (document), version, idempotent (ids), options, owner
    "run_resumed",  # data: retry_unknown, owner
    "step_started",  # data: attempt
    "step_succeeded",  # data: attempt, output (blob ref)
    "step_failed",  # data: attempt, error, kind, final, retry_in
    "step_cancelled",  # data: reason
    "run_cancel_requested",  # data: reason (written by another process)
    "run_cancelled",  # data: reason
    "run_finished",  # data: status, error
    "plan_version",  # data: plan (full spec), version, parent, trigger, seen, renamed, idempotent, the diff, meta
    "steps_added",  # data: steps, version, idempotent, meta (model_started_at, model_finished_at, trigger)
    "model_call",  # data: purpose, model, prompt_tokens, completion_tokens, cost_usd, started_at, finished_at, step
    "model_reserved",  # data: reservation (a call id), purpose, model, tokens, cost_usd (a budgeted call's worst case)
    "model_released",  # data: reservation, reason (a reserved call that cost nothing: its reservation freed)
    "escalation",  # data: rung (retry|fallback|local_repair|global_replan|fail|deadline_pressure), step, reason
    "answer",  # data: text (the run's final answer, from the joiner)
    "warning",  # data: message, blocked_s, tool, where (a tool blocked the event loop); changes no state
    "step_progress",  # data: fraction, message (reported by a long-running tool)
    "approval_requested",  # data: prompt (the step's approval text, or null)
    "approval_given",  # data: approve, reason, by, reply (the pos of the step_reply it applies)
    "input_requested",  # data: prompt, schema (a JSON schema or null), written by the human.input tool
    "input_given",  # data: value, by, reply
    "step_reply",  # data: approve, reason | value, by (a person's answer, written by another process; the first
    # reply to a wait is final, see engine/replies.py)
    "allocation",  # data: tier, model, samples, select, policy, p_all, compared (the allocator's choice for a step)
    "speculation_started",  # data: basis (producer -> prediction source), confidence (a step started on predictions)
    "speculation_adopted",  # data: started_at (its speculative attempt became the step's attempt)
    "speculation_discarded",  # data: reason, started_at, cost_usd (the speculative attempt was thrown away)
    "forecast",  # data: p_deadline, p_budget, p_success, p_all, makespan, cost_usd, critical_steps, runs (a refresh)
]


class Event(NamedTuple):
    """One journaled state change; ``pos`` is the journal's global position, set when it is stored.

    ``kind`` is one of the engine's ``EventKind`` for a plan run's events (the run emits only those), or a kind another
    product declares (a control run's, ``planweave.control.events.ControlKind``): the journal stores any kind string.
    A NamedTuple rather than a frozen dataclass: events are created on the engine's hot path, several per step.
    """

    run_id: str
    kind: str
    at: float
    step: str | None = None
    data: Mapping[str, Any] = {}
    pos: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pos": self.pos,
            "run_id": self.run_id,
            "kind": self.kind,
            "at": self.at,
            "step": self.step,
            "data": dict(self.data),
        }


RunStatus = Literal["running", "succeeded", "failed", "cancelled"]
OnFailure = Literal["stop", "continue"]  # what a step failing for good does to its run


class RunCreatedData(TypedDict):
    plan: Any  # the plan document (a JSON object; a ``PlanSpec`` when folded in process)
    version: NotRequired[int]  # default 1
    idempotent: NotRequired[Sequence[str]]  # the steps a resume may run again
    source: NotRequired[str | None]
    on_failure: NotRequired[OnFailure]  # journals older than the key continued
    options: NotRequired[Mapping[str, Any]]  # concurrency, capacities, limits
    owner: NotRequired[Any]  # the process that runs it
    trigger: NotRequired[str]  # what wrote the first version (default "plan")


class RunResumedData(TypedDict):
    retry_unknown: NotRequired[bool]
    owner: NotRequired[Any]


class StepStartedData(TypedDict):
    attempt: int


class CacheHitData(TypedDict):
    """Where a reused output came from: the run and step that produced it, and when (docs/caching.md)."""

    run: str
    step: str
    at: float


class StepSucceededData(TypedDict):
    attempt: NotRequired[int]
    output: NotRequired[str | None]  # the blob reference of the output
    cache_key: NotRequired[str]  # a cacheable step's key: the journal indexes the output under it
    cache: NotRequired[CacheHitData]  # the output was reused from the cache, not produced by a tool call
    done: NotRequired[bool]  # a person said the step's effect happened (resume --done): no tool call produced it
    by: NotRequired[str | None]  # who said so (with done)


class StepFailedData(TypedDict):
    attempt: NotRequired[int]
    error: NotRequired[str | None]
    kind: NotRequired[str | None]  # the failure's class: timeout, tool, reference, ...
    final: NotRequired[bool]  # default True: no retry or fallback follows
    retry_in: NotRequired[float]  # seconds until the retry (not final)
    fallback: NotRequired[bool]  # the next attempts use the step's fallback (not final)


class StepCancelledData(TypedDict):
    reason: NotRequired[str]
    resumable: NotRequired[bool]  # cancelled by a stopping run: a resume runs it again


class RunCancelRequestedData(TypedDict):
    reason: NotRequired[str]


class RunCancelledData(TypedDict):
    reason: NotRequired[str]
    status: NotRequired[Literal["failed"]]  # Run.fail: a decision ended the run failed (final, no resume)


class RunFinishedData(TypedDict):
    status: RunStatus
    error: NotRequired[str | None]


class PlanVersionData(TypedDict):
    plan: Any  # the full next version (a document, or a ``PlanSpec`` in process)
    version: int
    parent: NotRequired[int | None]
    trigger: NotRequired[str]  # default "replan"
    seen: NotRequired[int | None]  # the position the re-planner looked at
    renamed: NotRequired[Mapping[str, str]]
    idempotent: NotRequired[Sequence[str]]
    model_started_at: NotRequired[float | None]
    model_finished_at: NotRequired[float | None]
    # the diff (SpliceDiff.as_dict): added, kept, adopted, unchanged, cancelled, dropped
    added: NotRequired[Sequence[str]]
    kept: NotRequired[Sequence[str]]
    adopted: NotRequired[Sequence[str]]
    unchanged: NotRequired[Sequence[str]]
    cancelled: NotRequired[Sequence[str]]
    dropped: NotRequired[Sequence[str]]


class StepsAddedData(TypedDict):
    steps: NotRequired[Sequence[Any]]  # step documents (``Step`` objects in process)
    version: NotRequired[int]  # the version that wrote them (default: the current one)
    idempotent: NotRequired[Sequence[str]]
    model_started_at: NotRequired[float | None]
    model_finished_at: NotRequired[float | None]
    trigger: NotRequired[str]


class ModelCallData(TypedDict):
    purpose: NotRequired[str]
    model: NotRequired[str | None]
    prompt_tokens: NotRequired[int]
    completion_tokens: NotRequired[int]
    cost_usd: NotRequired[float]
    usage_source: NotRequired[str]
    started_at: NotRequired[float]
    finished_at: NotRequired[float]
    replans: NotRequired[int]
    at: NotRequired[float]  # default: the event's time
    reservation: NotRequired[str]  # the call's ``model_reserved`` (a budgeted call), which this settles


class ModelReservedData(TypedDict):
    """A budgeted model call's worst case, journaled (and durable) before its request goes out: a process killed
    during the call leaves it without its ``model_call``, and a resume counts it spent at this worst case."""

    reservation: str  # the call's id, repeated by the model_call (or model_released) that settles it
    tokens: int
    cost_usd: float
    purpose: NotRequired[str]
    model: NotRequired[str | None]


class ModelReleasedData(TypedDict):
    """A reserved call that ended having cost nothing (cut before its first token): its reservation is freed."""

    reservation: str
    reason: NotRequired[str]


class EscalationData(TypedDict):
    rung: str  # retry, fallback, local_repair, global_replan, repair_lines, stale, human, fail
    reason: NotRequired[str]
    tool: NotRequired[str]  # fallback: the fallback's tool
    region: NotRequired[Sequence[str]]  # local_repair: the steps re-planned
    question: NotRequired[str]  # human: the id of the question asked
    steps: NotRequired[Sequence[str]]  # fail: the steps given up on; deadline_pressure: the steps cancelled
    action: NotRequired[str]  # deadline_pressure: faster_tiers, drop_optional or replan
    p_deadline: NotRequired[float]  # deadline_pressure: the forecast's P(in time) that fell below the threshold
    threshold: NotRequired[float]  # deadline_pressure: that threshold
    remaining_s: NotRequired[float]  # deadline_pressure: seconds left until the deadline when it fired
    # escalate / deescalate (a model cascade, allocate/cascade_seam.py): the monitor that fired (stuck, milestone,
    # low_confidence; none for a streak's deescalate), the tiers moved between, the model now used
    monitor: NotRequired[str]
    from_tier: NotRequired[str]
    to_tier: NotRequired[str]
    model: NotRequired[str]
    attempt: NotRequired[int]
    cascade: NotRequired[str]  # the cascade key
    streak: NotRequired[int]  # deescalate: the successes in a row it took
    crossing: NotRequired[int]  # deadline_pressure: how many times pressure fired in the run, this one included


class AnswerData(TypedDict):
    text: NotRequired[str | None]


class WarningData(TypedDict):
    message: NotRequired[str]


class StepProgressData(TypedDict):
    fraction: NotRequired[float | None]
    message: NotRequired[str]


class ApprovalRequestedData(TypedDict):
    prompt: NotRequired[str | None]


class ApprovalGivenData(TypedDict):
    approve: NotRequired[bool]
    reason: NotRequired[str | None]
    by: NotRequired[str]  # who answered, when they said
    reply: NotRequired[int]  # the position of the step_reply this applies (a reply from another process)


class InputRequestedData(TypedDict):
    prompt: NotRequired[str | None]
    schema: NotRequired[Mapping[str, Any] | None]


class InputGivenData(TypedDict):
    value: NotRequired[Any]
    by: NotRequired[str]
    reply: NotRequired[int]


class StepReplyData(TypedDict):
    approve: NotRequired[bool]
    reason: NotRequired[str | None]
    value: NotRequired[Any]
    by: NotRequired[str]


class AllocationData(TypedDict):
    tier: str  # the tier chosen for the step's model call(s)
    model: NotRequired[str]  # the model that tier names
    samples: int  # parallel samples
    select: NotRequired[str | None]  # vote, first_valid or verifier (several samples)
    policy: NotRequired[str]  # monte_carlo, greedy, cheapest, strongest
    attempt: NotRequired[int]
    p_all: NotRequired[float]  # estimated P(the run completes within budget and deadline) with this choice
    p_success: NotRequired[float]
    p_budget: NotRequired[float]
    p_deadline: NotRequired[float]
    sims: NotRequired[int]  # Monte Carlo runs behind the estimates
    overhead_s: NotRequired[float]  # wall seconds the decision took
    compared: NotRequired[Sequence[Mapping[str, Any]]]  # every candidate: tier, samples, p_all, cost_usd, fits
    reason: NotRequired[str]
    history: NotRequired[Mapping[str, Mapping[str, Any]]]  # per tier fitted from past runs: calls, p_success, ...
    step: NotRequired[str]  # "planner": the planner's own call (allocate/planner_alloc.py; the event has no step)
    purpose: NotRequired[str]  # the planner's call: plan, replan, repair or join


class ForecastData(TypedDict):
    """A run's forecast, refreshed after a step outcome (``forecast/live.py``); times are seconds from its start."""

    runs: int  # simulated runs behind it
    p_success: float | None  # None: unknown (the history holds no outcome)
    p_deadline: float | None  # None: the run has no deadline
    p_budget: float | None  # None: the run has no budget in USD
    p_all: float | None  # None: unknown, as p_success
    makespan: Mapping[str, float]  # p50, p90, p99
    cost_usd: Mapping[str, float]  # p50, p90, p99
    critical_steps: Sequence[str]
    deadline: NotRequired[float | None]
    budget_usd: NotRequired[float | None]
    elapsed: NotRequired[float]  # seconds the run had run when forecast
    histogram: NotRequired[Sequence[Sequence[float]]]  # (bucket start, count) of the simulated makespans
    overhead_s: NotRequired[float]  # wall seconds the refresh took


class SpeculationStartedData(TypedDict):
    """A step started on predicted inputs (docs/speculation.md): no output of it is visible until it is adopted."""

    basis: Mapping[str, str]  # each producer it did not wait for -> where its prediction came from
    confidence: float  # the product of those predictions' confidences
    mode: NotRequired[str]  # safe or eager


class SpeculationAdoptedData(TypedDict):
    """The real arguments equal the predicted ones: the speculative attempt is the step's attempt (the
    ``step_started`` just before names its number; the step started at ``started_at``)."""

    started_at: float
    draft_step: NotRequired[str]  # speculative planning: the draft's id of the step (planning/draft.py)
    finished_at: NotRequired[float]  # when the attempt ended, if it had before it was adopted (its head start)


class SpeculationDiscardedData(TypedDict):
    """The speculative attempt was thrown away: it never gives the step an output."""

    reason: str  # mismatch: <producer>, preempted, failed: <error>, producer <id> <status>, ...
    started_at: NotRequired[float]
    cost_usd: NotRequired[float]  # what its model calls cost: the extra cost of speculation


# The payload type of every kind of the engine's events: the fold's dispatch table is checked against it
# (tests/engine/test_state.py).
PAYLOADS: Mapping[EventKind, type] = {
    "run_created": RunCreatedData,
    "run_resumed": RunResumedData,
    "step_started": StepStartedData,
    "step_succeeded": StepSucceededData,
    "step_failed": StepFailedData,
    "step_cancelled": StepCancelledData,
    "run_cancel_requested": RunCancelRequestedData,
    "run_cancelled": RunCancelledData,
    "run_finished": RunFinishedData,
    "plan_version": PlanVersionData,
    "steps_added": StepsAddedData,
    "model_call": ModelCallData,
    "model_reserved": ModelReservedData,
    "model_released": ModelReleasedData,
    "escalation": EscalationData,
    "answer": AnswerData,
    "warning": WarningData,
    "step_progress": StepProgressData,
    "approval_requested": ApprovalRequestedData,
    "approval_given": ApprovalGivenData,
    "input_requested": InputRequestedData,
    "input_given": InputGivenData,
    "step_reply": StepReplyData,
    "allocation": AllocationData,
    "forecast": ForecastData,
    "speculation_started": SpeculationStartedData,
    "speculation_adopted": SpeculationAdoptedData,
    "speculation_discarded": SpeculationDiscardedData,
}
