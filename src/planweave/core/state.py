"""The step state machine and the fold of a run's events into its state (pure: no I/O).

The engine applies each event to :class:`RunState` as it emits it; resume folds the journaled events through the same
code, so a resumed run sees exactly the state the interrupted one had. Readiness and skipping are derived here, not
journaled: :meth:`RunState.apply` returns the steps an event made ready.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from planweave.core.errors import JournalError
from planweave.core.events import (
    AnswerData,
    ApprovalGivenData,
    ApprovalRequestedData,
    EscalationData,
    Event,
    InputGivenData,
    InputRequestedData,
    ModelCallData,
    ModelReleasedData,
    ModelReservedData,
    OnFailure,
    PlanVersionData,
    RunCancelledData,
    RunCreatedData,
    RunFinishedData,
    RunResumedData,
    RunStatus,
    SpeculationAdoptedData,
    SpeculationDiscardedData,
    SpeculationStartedData,
    StepCancelledData,
    StepFailedData,
    StepProgressData,
    StepReplyData,
    StepsAddedData,
    StepStartedData,
    StepSucceededData,
)
from planweave.core.plan.graph import Plan
from planweave.core.plan.model import Step, StepStatus
from planweave.core.splice import splice_diff

__all__ = ["ACTIVE", "TRANSITIONS", "AttemptOutcome", "OnFailure", "RunState", "RunStatus", "StepRecord"]

# Which status a step may move to from which: the state machine.
TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = {
    "pending": frozenset({"ready", "skipped", "cancelled"}),
    "ready": frozenset({"running", "cancelled", "skipped", "waiting_approval"}),
    # approved -> ready; rejected or timed out -> failed, or ready again to run the fallback
    "waiting_approval": frozenset({"ready", "failed", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "ready", "cancelled", "unknown", "waiting_input"}),
    # a value given -> running; timed out -> failed or ready (retry); interrupted -> ready or unknown on resume
    "waiting_input": frozenset({"running", "failed", "ready", "cancelled", "unknown"}),
    "unknown": frozenset({"ready", "cancelled", "succeeded"}),  # succeeded: a person marked it done
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "skipped": frozenset(),
}

# How one attempt of a step ended ("running" while it runs); "interrupted": the process stopped under it.
AttemptOutcome = Literal["running", "succeeded", "failed", "cancelled", "interrupted"]
AttemptEntry = tuple[int, float, float | None, AttemptOutcome]  # attempt, started_at, finished_at, outcome
# Statuses that keep a run open. Waiting steps hold no capacity, but the run is not over while a person may answer.
ACTIVE: frozenset[StepStatus] = frozenset({"ready", "running", "waiting_approval", "waiting_input"})
NOTHING_READY: tuple[str, ...] = ()  # shared: most events make nothing ready, and this is the hot path
_VERSION_META = frozenset({"model_started_at", "model_finished_at", "trigger"})  # what steps_added may update


class StepRecord:
    """The mutable state of one step within a run."""

    __slots__ = (
        "approved",
        "attempt_finished_at",
        "attempt_outcome",
        "attempt_started_at",
        "attempts",
        "earlier_attempts",
        "error",
        "error_kind",
        "fallback_active",
        "finished_at",
        "given",
        "id",
        "input_schema",
        "output_ref",
        "progress",
        "prompt",
        "reply",
        "resumable",
        "retry_at",
        "speculative",
        "started_at",
        "status",
        "waiting_since",
    )

    def __init__(self, step_id: str) -> None:
        self.id = step_id
        self.status: StepStatus = "pending"
        self.attempts = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.error: str | None = None
        self.error_kind: str | None = None
        self.output_ref: str | None = None
        self.retry_at: float | None = None
        self.fallback_active = False  # the next attempts use the step's fallback
        self.progress: tuple[float | None, str] | None = None  # the last progress a long-running tool reported
        self.approved = False  # a person approved the step (``approval:``): it is not asked again
        self.waiting_since: float | None = None  # when the step started waiting for a person
        self.prompt: str | None = None  # what the person is asked (the approval text or the input prompt)
        self.input_schema: Mapping[str, Any] | None = None  # the JSON schema a value given must satisfy
        self.given: tuple[Any] | None = None  # the value a person gave, until the step consumes it
        self.reply: Mapping[str, Any] | None = None  # a reply another process journaled, not applied yet
        self.resumable = False  # cancelled by a stopping run: a resume runs it again
        self.speculative = False  # its attempt started speculatively, on predicted inputs, and was adopted
        # The attempts, for timelines (attempt_log). The current (or last) one in three fields, the earlier ones as
        # (attempt, started_at, finished_at or None, outcome) entries: most steps have one attempt, and a list and
        # two tuples per step were 12 % of a compiled no-op step at 10,000 steps (docs/benchmarks.md, "a compiled
        # engine"). A shared empty tuple until a second attempt.
        self.attempt_started_at: float | None = None
        self.attempt_finished_at: float | None = None
        self.attempt_outcome: AttemptOutcome = "running"
        self.earlier_attempts: list[AttemptEntry] | tuple[()] = ()

    @property
    def attempt_log(self) -> list[AttemptEntry]:
        """``(attempt, started_at, finished_at or None, outcome)`` per attempt, oldest first (a new list)."""
        if self.attempt_started_at is None:
            return list(self.earlier_attempts)
        return [*self.earlier_attempts,
                (self.attempts, self.attempt_started_at, self.attempt_finished_at, self.attempt_outcome)]

    def _begin_attempt(self, attempt: int, at: float) -> None:
        """Attempt ``attempt`` started at ``at``: the one before it (if any) joins the earlier ones."""
        if self.attempt_started_at is not None:
            entry: AttemptEntry = (self.attempts, self.attempt_started_at, self.attempt_finished_at,
                                   self.attempt_outcome)
            if self.earlier_attempts:
                self.earlier_attempts.append(entry)
            else:
                self.earlier_attempts = [entry]
        self.attempts = attempt
        self.attempt_started_at = at
        self.attempt_finished_at = None
        self.attempt_outcome = "running"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "attempts": self.attempts,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            **({"prompt": self.prompt} if self.status in ("waiting_approval", "waiting_input") else {}),
            **({"speculative": True} if self.speculative else {}),
        }


class RunState:
    """A run's state as the fold of its events."""

    def __init__(self, run_id: str, plan: Plan, idempotent: Iterable[str]) -> None:
        self.run_id = run_id
        self.plan = plan
        self.idempotent = frozenset(idempotent)
        self.records = {sid: StepRecord(sid) for sid in plan.order}
        self.waiting = dict(plan.in_degrees)
        self.status: RunStatus = "running"
        self.created_at: float | None = None
        self.finished_at: float | None = None
        self.error: str | None = None
        self.root_cause: str | None = None
        self.active = 0  # steps that are ready or running: the run is over when this reaches zero
        self.last_pos = 0
        self.events_applied = 0
        self.last_at: float | None = None  # the time of the last event applied
        # (from, to) per resume: from the run's last event before it (its process died then, or a little after:
        # nothing journals a kill) to the resume, a time no process ran the run.
        self.downtime: list[tuple[float, float]] = []
        self.retired: list[tuple[int, StepRecord]] = []  # (version, record) of steps later versions replaced
        self.retired_steps: list[Step] = []  # the step each entry of `retired` ran (same index): its tool, for history
        self.versions: list[dict[str, Any]] = []  # one entry per plan version: trigger, times and its diff
        self.model_calls: list[dict[str, Any]] = []
        self.tokens = 0  # the model calls' usage, and the worst case of those a crash left unsettled
        self.cost_usd = 0.0
        # Budgeted model calls by reservation id: those in flight (model_reserved, not settled yet), and those a
        # process died during (open at a run_resumed: counted in tokens and cost at their reserved worst case).
        self.reserved: dict[str, dict[str, Any]] = {}
        self.unsettled: dict[str, dict[str, Any]] = {}
        self.escalations: list[dict[str, Any]] = []
        self.answer: str | None = None
        self.failed_by: str | None = None  # why the run was ended failed on purpose (Run.fail): final, no resume
        self.on_failure: OnFailure = "continue"  # what a final step failure does; set by run_created
        self.approvals: frozenset[str] = plan.approval_steps
        # Speculative attempts, for timelines: step, started_at, finished_at, outcome (running, adopted,
        # discarded: <reason>, interrupted); the attempts in flight by step; the cost of the discarded ones.
        self.speculations: list[dict[str, Any]] = []
        self._speculating: dict[str, dict[str, Any]] = {}
        self.speculation_cost_usd = 0.0

    @classmethod
    def from_events(cls, run_id: str, events: Sequence[Event]) -> RunState:
        """Fold a run's journaled events (the first must be ``run_created``) into its state."""
        from planweave.core.plan.graph import parse_plan_document, validate_plan
        from planweave.core.plan.model import PlanSpec

        if not events or events[0].kind != "run_created":
            first = events[0].kind if events else "nothing"
            raise JournalError(f"run '{run_id}': the journal starts with {first}, not run_created")
        created = events[0]
        raw = created.data["plan"]
        spec = raw if isinstance(raw, PlanSpec) else parse_plan_document(raw, f"run '{run_id}'")
        plan = validate_plan(spec, version=int(created.data.get("version", 1)), source=f"run '{run_id}'")
        state = cls(run_id, plan, created.data.get("idempotent", ()))
        for event in events:
            state.apply(event)
        return state

    # -- the state machine -------------------------------------------------------------------------------------
    def _move(self, rec: StepRecord, to: StepStatus, event: Event) -> None:
        if to not in TRANSITIONS[rec.status]:
            raise JournalError(
                f"run '{self.run_id}': event {event.kind} moves step '{rec.id}' from {rec.status} to {to}, "
                "which the step state machine does not allow"
            )
        was_active = rec.status in ACTIVE
        now_active = to in ACTIVE
        self.active += now_active - was_active
        rec.status = to

    def _skip_dependents(self, sid: str, reason: str, event: Event) -> None:
        stack = list(self.plan.dependents[sid])
        while stack:
            child = self.records[stack.pop()]
            if child.status == "pending":
                self._move(child, "skipped", event)
                child.error = reason
                child.finished_at = event.at
                stack.extend(self.plan.dependents[child.id])

    def _release_dependents(self, sid: str) -> Sequence[str]:
        ready: list[str] | None = None
        waiting = self.waiting
        records = self.records
        for child in self.plan.dependents[sid]:
            left = waiting[child] - 1
            waiting[child] = left
            if left == 0 and (rec := records[child]).status == "pending":
                rec.status = "ready"  # the common transition, inlined (TRANSITIONS allows it): ready is active
                self.active += 1
                if ready is None:
                    ready = [child]
                else:
                    ready.append(child)
        return ready if ready is not None else NOTHING_READY

    # -- the fold ----------------------------------------------------------------------------------------------
    def apply(self, event: Event) -> Sequence[str]:
        """Apply one event; return the steps it made ready (in plan order)."""
        self.events_applied += 1
        if event.pos is not None:
            self.last_pos = event.pos
        try:
            fold = _FOLD[event.kind]
        except KeyError:
            raise JournalError(f"run '{self.run_id}': unknown event kind '{event.kind}'") from None
        ready = fold(self, event, event.data)
        self.last_at = event.at
        return ready

    # One handler per kind of event, each given the event's payload as its kind's type (engine/events.py); _FOLD,
    # after the class, maps the kinds to them. The step events are the hot path: the engine folds several per step.
    def _step_started(self, event: Event, data: StepStartedData) -> Sequence[str]:
        return self.step_started(event.step, event.at, data)  # type: ignore[arg-type]

    def _step_succeeded(self, event: Event, data: StepSucceededData) -> Sequence[str]:
        return self.step_succeeded(event.step, event.at, data)  # type: ignore[arg-type]

    # The fold of the two events every attempt has, callable without the event: a run whose events nobody can see
    # (a journal that keeps nothing, no listener) folds them without building them (Emission.emit_step).
    def step_started(self, sid: str, at: float, data: StepStartedData) -> Sequence[str]:
        """Fold a ``step_started`` event of step ``sid`` at ``at``."""
        rec = self.records[sid]
        if rec.status == "ready":  # the common transition, inlined: both states count as active
            rec.status = "running"
        else:
            self._move(rec, "running", Event(self.run_id, "step_started", at, sid, data))
        rec.retry_at = None
        if rec.started_at is None:
            rec.started_at = at
        if rec.attempt_started_at is None:  # the first attempt, inlined: nothing to move to the earlier ones
            rec.attempts = data["attempt"]
            rec.attempt_started_at = at
        else:
            rec._begin_attempt(data["attempt"], at)
        return NOTHING_READY

    def step_succeeded(self, sid: str, at: float, data: StepSucceededData) -> Sequence[str]:
        """Fold a ``step_succeeded`` event of step ``sid`` at ``at``; return the steps it made ready."""
        rec = self.records[sid]
        if rec.status == "running":  # the common transition, inlined
            rec.status = "succeeded"
            self.active -= 1
        else:
            self._move(rec, "succeeded", Event(self.run_id, "step_succeeded", at, sid, data))
        rec.finished_at = at
        rec.output_ref = data.get("output")
        rec.error = None
        rec.given = None
        self._close_attempt(rec, at, "succeeded")
        return self._release_dependents(sid)

    def _step_failed(self, event: Event, data: StepFailedData) -> Sequence[str]:
        rec = self.records[event.step]  # type: ignore[index]
        rec.error = data.get("error")
        rec.error_kind = data.get("kind")
        rec.given = None
        rec.waiting_since = None
        self._close_attempt(rec, event.at, "failed")
        if data.get("final", True):
            self._move(rec, "failed", event)
            rec.finished_at = event.at
            if self.root_cause is None:
                self.root_cause = rec.id
            self._skip_dependents(rec.id, f"dependency '{rec.id}' failed", event)
        else:
            self._move(rec, "ready", event)
            rec.retry_at = event.at + float(data.get("retry_in", 0.0))
            if data.get("fallback"):
                rec.fallback_active = True
        return NOTHING_READY

    def _step_cancelled(self, event: Event, data: StepCancelledData) -> Sequence[str]:
        rec = self.records[event.step]  # type: ignore[index]
        if rec.status not in ("succeeded", "failed", "cancelled", "skipped"):
            self._move(rec, "cancelled", event)
            rec.finished_at = event.at
            rec.error = data.get("reason", "cancelled")
            self._close_attempt(rec, event.at, "cancelled")
            if data.get("resumable"):  # a stopping run: dependents wait for the resume that re-runs it
                rec.resumable = True
            else:
                self._skip_dependents(rec.id, f"dependency '{rec.id}' was cancelled", event)
        return NOTHING_READY

    def _run_created(self, event: Event, data: RunCreatedData) -> Sequence[str]:
        self.created_at = event.at
        self.on_failure = data.get("on_failure", "continue")  # journals older than the key continued
        self.versions.append({
            "version": self.plan.version, "parent": None, "trigger": data.get("trigger", "plan"),
            "model_started_at": None, "model_finished_at": None, "spliced_at": event.at,
            "added": list(self.plan.order), "kept": [], "adopted": [], "cancelled": [], "dropped": [],
        })
        ready = list(self.plan.roots)  # as run_created finds them: no step has finished
        for sid in ready:
            self._move(self.records[sid], "ready", event)
        return ready

    def _run_cancelled(self, event: Event, data: RunCancelledData) -> Sequence[str]:
        reason = data.get("reason", "run cancelled")
        for rec in self.records.values():
            if rec.status in ACTIVE or rec.status in ("pending", "unknown"):
                self._move(rec, "cancelled", event)
                rec.finished_at = event.at
                rec.error = reason
                self._close_attempt(rec, event.at, "cancelled")
        if data.get("status") == "failed":  # Run.fail: a decision ended the run failed
            self.status, self.failed_by = "failed", reason
        else:
            self.status = "cancelled"
        self.error = reason
        return NOTHING_READY

    def _run_finished(self, event: Event, data: RunFinishedData) -> Sequence[str]:
        self.status = data["status"]
        self.error = data.get("error")
        self.finished_at = event.at
        return NOTHING_READY

    def _model_call(self, event: Event, data: ModelCallData) -> Sequence[str]:
        call: dict[str, Any] = dict(data)
        call.setdefault("at", event.at)
        if event.step is not None:
            call["step"] = event.step
        self.model_calls.append(call)
        self.tokens += int(data.get("prompt_tokens", 0)) + int(data.get("completion_tokens", 0))
        self.cost_usd += float(data.get("cost_usd", 0.0))
        if "reservation" in data:
            self._settled(data["reservation"])
        return NOTHING_READY

    def _model_reserved(self, event: Event, data: ModelReservedData) -> Sequence[str]:
        self.reserved[data["reservation"]] = {"at": event.at, "step": event.step, **data}
        return NOTHING_READY

    def _model_released(self, event: Event, data: ModelReleasedData) -> Sequence[str]:
        self._settled(data["reservation"])
        return NOTHING_READY

    def _settled(self, reservation: str) -> None:
        """Reservation ``reservation`` ended (its model_call, or released): no longer in flight. One counted unsettled
        at a resume (a process still running it, that lost the run, settled it late) is counted as settled instead."""
        self.reserved.pop(reservation, None)
        late = self.unsettled.pop(reservation, None)
        if late is not None:
            self.tokens -= int(late.get("tokens", 0))
            self.cost_usd -= float(late.get("cost_usd", 0.0))

    def _escalation(self, event: Event, data: EscalationData) -> Sequence[str]:
        self.escalations.append({"at": event.at, "step": event.step, **data})
        return NOTHING_READY

    def _step_progress(self, event: Event, data: StepProgressData) -> Sequence[str]:
        found = self.records.get(event.step or "")
        if found is not None:
            found.progress = (data.get("fraction"), data.get("message", ""))
        return NOTHING_READY

    def _answer(self, event: Event, data: AnswerData) -> Sequence[str]:
        self.answer = data.get("text")
        return NOTHING_READY

    # -- speculation (docs/speculation.md): a speculative attempt changes no step's status until it is adopted ------
    def _speculation_started(self, event: Event, data: SpeculationStartedData) -> Sequence[str]:
        entry: dict[str, Any] = {"step": event.step, "started_at": event.at, "finished_at": None,
                                 "outcome": "running", "basis": dict(data.get("basis", {}))}
        self.speculations.append(entry)
        self._speculating[event.step or ""] = entry
        return NOTHING_READY

    def _speculation_adopted(self, event: Event, data: SpeculationAdoptedData) -> Sequence[str]:
        """After the adopting ``step_started``: the step's attempt began when its speculative attempt did."""
        rec = self._waiting_record(event)
        started = float(data.get("started_at", event.at))
        rec.speculative = True
        rec.started_at = started if rec.started_at is None else min(rec.started_at, started)
        real_start = event.at
        if rec.attempt_started_at is not None and rec.attempt_finished_at is None:
            real_start = min(real_start, rec.attempt_started_at)  # when the step started on its real inputs
            rec.attempt_started_at = started
        entry = self._speculating.pop(str(data.get("draft_step", rec.id)), None)  # a draft's id may differ
        if entry is not None:
            entry["outcome"] = "adopted"
            entry["real_start"] = real_start
            entry["attempt_end"] = float(data.get("finished_at", real_start))  # still running: after real_start
        return NOTHING_READY

    def _speculation_discarded(self, event: Event, data: SpeculationDiscardedData) -> Sequence[str]:
        entry = self._speculating.pop(event.step or "", None)
        if entry is not None:
            entry["finished_at"] = event.at
            entry["outcome"] = f"discarded: {data.get('reason', '')}"
        self.speculation_cost_usd += float(data.get("cost_usd", 0.0))
        return NOTHING_READY

    def _no_change(self, event: Event, data: Mapping[str, Any]) -> Sequence[str]:
        """``warning`` and ``run_cancel_requested`` (the owner acts on it): journaled, but no state changes."""
        return NOTHING_READY

    # -- people in the run --------------------------------------------------------------------------------------------
    def needs_approval(self, sid: str) -> bool:
        """Whether ready step ``sid`` must wait for a person before it starts (its first attempt, not a fallback)."""
        rec = self.records[sid]
        return sid in self.approvals and not rec.approved and not rec.fallback_active

    def _waiting_record(self, event: Event) -> StepRecord:
        """The record of the step a person's event names; a journal naming no step of the run is corrupt."""
        rec = self.records.get(event.step or "")
        if rec is None:
            raise JournalError(f"run '{self.run_id}': event {event.kind} names unknown step '{event.step}'")
        return rec

    def _step_reply(self, event: Event, data: StepReplyData) -> Sequence[str]:
        # Written by another process; the owner applies it, a resume applies it if not. The first reply is final:
        # a later one (journals refuse it now; older ones may hold two) never replaces it. Its position goes with
        # it, so the decision that applies it names it (``reply``) and it is taken once.
        rec = self._waiting_record(event)
        if rec.reply is None:
            rec.reply = {**data, "pos": event.pos}
        return NOTHING_READY

    def _approval_requested(self, event: Event, data: ApprovalRequestedData) -> Sequence[str]:
        rec = self._waiting_record(event)
        self._move(rec, "waiting_approval", event)
        rec.waiting_since, rec.prompt = event.at, data.get("prompt")
        return NOTHING_READY

    def _input_requested(self, event: Event, data: InputRequestedData) -> Sequence[str]:
        rec = self._waiting_record(event)
        self._move(rec, "waiting_input", event)
        rec.waiting_since, rec.prompt = event.at, data.get("prompt")
        rec.input_schema = data.get("schema")
        return NOTHING_READY

    def _input_given(self, event: Event, data: InputGivenData) -> Sequence[str]:
        rec = self._waiting_record(event)
        self._move(rec, "running", event)
        rec.given, rec.reply, rec.waiting_since = (data.get("value"),), None, None
        return NOTHING_READY

    def _approval_given(self, event: Event, data: ApprovalGivenData) -> Sequence[str]:
        """Only an approval makes a step ready; a rejection is followed by the step_failed that says what follows."""
        rec = self._waiting_record(event)
        rec.reply = None
        if data.get("approve"):
            self._move(rec, "ready", event)
            rec.approved, rec.waiting_since = True, None
            return (rec.id,)
        return NOTHING_READY

    def waiting_steps(self) -> dict[str, StepStatus]:
        """Steps waiting for a person: id -> ``waiting_approval`` or ``waiting_input``."""
        return {r.id: r.status for r in self.records.values() if r.status in ("waiting_approval", "waiting_input")}

    # -- plan versions ----------------------------------------------------------------------------------------------
    def _plan_version(self, event: Event, data: PlanVersionData) -> Sequence[str]:
        new_plan = self._plan_from(data["plan"], int(data["version"]), data.get("parent"))
        diff = splice_diff(self.records, self.plan, new_plan)
        self.versions.append({
            "version": new_plan.version, "parent": data.get("parent"),
            "trigger": data.get("trigger", "replan"),
            "model_started_at": data.get("model_started_at"),
            "model_finished_at": data.get("model_finished_at"),
            "spliced_at": event.at, "renamed": dict(data.get("renamed", {})), **diff.as_dict(),
        })
        return self._rebase(new_plan, set(diff.added), event, data)

    def _steps_added(self, event: Event, data: StepsAddedData) -> Sequence[str]:
        from planweave.core.plan.model import Step

        steps = [s if isinstance(s, Step) else Step.model_validate(s) for s in data.get("steps", ())]
        version = int(data.get("version", self.plan.version))
        # Lines of a planner that is still writing may land after a re-plan spliced a newer version in: they are
        # recorded on the version that wrote them, and extend whatever version is current.
        entry: dict[str, Any] | None = None
        for known in self.versions[::-1]:  # not reversed(): mypyc fails on it here (an internal error)
            if known["version"] == version:
                entry = known
                break
        if entry is None:
            entry = {"version": version, "parent": self.plan.version if version != self.plan.version else None,
                     "trigger": data.get("trigger", "plan"), "model_started_at": None,
                     "model_finished_at": None, "spliced_at": None, "added": [], "kept": [], "adopted": [],
                     "cancelled": [], "dropped": []}
            self.versions.append(entry)
        entry.update((key, value) for key, value in data.items() if key in _VERSION_META)
        if not steps:
            return NOTHING_READY
        if entry["spliced_at"] is None:
            entry["spliced_at"] = event.at
        entry["added"].extend(s.id for s in steps)
        spec = self.plan.spec.model_copy(update={"steps": (*self.plan.spec.steps, *steps)})
        new_plan = self._plan_from(spec, self.plan.version, self.plan.parent)
        return self._rebase(new_plan, {s.id for s in steps}, event, data)

    def _plan_from(self, raw: Any, version: int, parent: int | None) -> Plan:
        from planweave.core.plan.graph import parse_plan_document, validate_plan
        from planweave.core.plan.model import PlanSpec

        spec = raw if isinstance(raw, PlanSpec) else parse_plan_document(raw, f"run '{self.run_id}' version {version}")
        return validate_plan(spec, version=version, parent=parent, source=f"run '{self.run_id}' version {version}")

    def _rebase(self, new_plan: Plan, fresh: set[str], event: Event,
                data: PlanVersionData | StepsAddedData) -> Sequence[str]:
        """Switch to ``new_plan``: steps in ``fresh`` start over as pending, the others keep their records."""
        old_version = self.plan.version
        records: dict[str, StepRecord] = {}
        for sid in new_plan.order:
            rec = self.records.get(sid)
            if rec is None or sid in fresh:
                if rec is not None:
                    self._retire(rec, old_version, event, data.get("version"))
                rec = StepRecord(sid)
            records[sid] = rec
        for sid, rec in self.records.items():
            if sid not in new_plan.steps:
                self._retire(rec, old_version, event, data.get("version"))
        self.plan = new_plan
        self.records = records
        self.approvals = new_plan.approval_steps
        if self.root_cause is not None and (
            self.root_cause not in records or records[self.root_cause].status != "failed"
        ):  # the failed step was replaced: the failure is repaired, not the run's cause any more
            self.root_cause = next((r.id for r in records.values() if r.status == "failed"), None)
        self.idempotent = self.idempotent | frozenset(data.get("idempotent", ()))
        # Recount what every waiting step still waits for, and what is active.
        self.waiting = {}
        self.active = 0
        ready: list[str] = []
        for sid in new_plan.order:
            rec = records[sid]
            self.waiting[sid] = sum(1 for d in new_plan.deps[sid] if records[d].status != "succeeded")
            if rec.status == "pending" and any(records[d].status in ("failed", "skipped", "cancelled")
                                               for d in new_plan.deps[sid]):
                dead = next(d for d in new_plan.deps[sid] if records[d].status in ("failed", "skipped", "cancelled"))
                rec.status = "skipped"
                rec.error = f"dependency '{dead}' {records[dead].status}"
                rec.finished_at = event.at
            elif rec.status == "pending" and self.waiting[sid] == 0:
                rec.status = "ready"
                ready.append(sid)
            if rec.status in ACTIVE:
                self.active += 1
        return ready

    def _retire(self, rec: StepRecord, version: int, event: Event, replaced_by: int | None) -> None:
        if rec.status in ACTIVE or rec.status in ("pending", "unknown"):
            rec.status = "cancelled"
            rec.finished_at = event.at
            rec.error = f"replaced by plan version {replaced_by}"
            self._close_attempt(rec, event.at, "cancelled")
        self.retired.append((version, rec))
        self.retired_steps.append(self.plan.steps[rec.id])  # self.plan is still the version it ran in

    def _close_attempt(self, rec: StepRecord, at: float, outcome: AttemptOutcome) -> None:
        if rec.attempt_started_at is not None and rec.attempt_finished_at is None:
            rec.attempt_finished_at = at
            rec.attempt_outcome = outcome

    def _run_resumed(self, event: Event, data: RunResumedData) -> Sequence[str]:
        if self.last_at is not None and event.at > self.last_at:
            self.downtime.append((self.last_at, event.at))
        retry_unknown = bool(data.get("retry_unknown"))
        ready: list[str] = []
        for entry in self._speculating.values():  # died with the process: nothing of them is kept
            entry["finished_at"], entry["outcome"] = event.at, "interrupted"
        self._speculating.clear()
        # Model calls in flight died with the process, which never journaled what they cost: a provider may have
        # billed up to their worst case, so they count spent at it (docs/budgets.md, "Across crashes").
        for rid, held in self.reserved.items():
            self.unsettled[rid] = held
            self.tokens += int(held.get("tokens", 0))
            self.cost_usd += float(held.get("cost_usd", 0.0))
        self.reserved.clear()
        self.status = "running"
        self.finished_at = None
        self.error = None
        for rec in self.records.values():
            if rec.status == "cancelled" and rec.resumable:
                # Cancelled by a run that stopped after a final failure, not by a person: the resume runs it again
                # (a terminal status left on purpose, so it bypasses the state machine like a splice does).
                rec.status, rec.resumable, rec.error, rec.finished_at = "ready", False, None, None
                self.active += 1
            elif rec.status in ("running", "waiting_input"):
                self._close_attempt(rec, event.at, "interrupted")
                if rec.id in self.idempotent or retry_unknown:
                    self._move(rec, "ready", event)
                else:
                    self._move(rec, "unknown", event)
                    rec.error = (
                        "was running when the run was interrupted and is not idempotent, so its outcome is unknown"
                    )
            elif rec.status == "unknown" and retry_unknown:
                self._move(rec, "ready", event)
                rec.error = None
            if rec.status == "ready":
                ready.append(rec.id)
        return ready

    # -- views -------------------------------------------------------------------------------------------------
    def ran_s(self, start: float | None, end: float | None) -> float | None:
        """Of the time from ``start`` to ``end``, the seconds a process ran the run: less its :attr:`downtime`
        (None if either is None)."""
        if start is None or end is None:
            return None
        down = sum(max(0.0, min(end, until) - max(start, since)) for since, until in self.downtime)
        return max(0.0, end - start - down)

    def outcome(self) -> tuple[RunStatus, str | None]:
        """The status and error a run that has no active step ends with."""
        if self.status == "cancelled":
            return "cancelled", self.error
        if self.failed_by is not None:
            return "failed", self.failed_by
        # One pass for the common case: every step succeeded, nothing to report.
        left = [r for r in self.records.values() if r.status != "succeeded"]
        failed = [r for r in left if r.status == "failed"]
        if failed:
            root = self.records[self.root_cause] if self.root_cause else failed[0]
            more = f" ({len(failed) - 1} other step(s) failed too)" if len(failed) > 1 else ""
            # The first line: the rest of a step's error (what a failed program printed) is its own detail.
            first = (root.error or "").strip().partition("\n")[0] or root.error
            return "failed", f"step '{root.id}' failed: {first}{more}"
        unknown = [r.id for r in left if r.status == "unknown"]
        if unknown:
            names = ", ".join(f"'{u}'" for u in unknown)
            return "failed", (
                f"step(s) {names} were running when the run was interrupted and are not idempotent: their outcome is "
                f"unknown. Check their effects, then run `planweave resume {self.run_id} --retry-unknown` (to run "
                "them again) or `--done STEP[=OUTPUT]` (their effect happened)."
            )
        blocked = [r.id for r in left if r.status == "pending"]
        if blocked:
            return "failed", f"{len(blocked)} step(s) could not start: " + ", ".join(blocked[:10])
        return "succeeded", None

    def summary(self) -> dict[str, Any]:
        """The run as the ``--json`` contract object.

        ``answer`` is the joiner's final answer of a goal run that succeeded, else None; a run that did not succeed
        reports its joiner's text (if any) as ``partial_answer`` instead (None otherwise).
        """
        makespan = None
        if self.created_at is not None and self.finished_at is not None:
            makespan = self.finished_at - self.created_at
        return {
            "run_id": self.run_id,
            "status": self.status,
            "started_at": self.created_at,
            "finished_at": self.finished_at,
            "makespan_s": makespan,
            "error": self.error,
            "steps": {sid: rec.to_json() for sid, rec in self.records.items()},
            # Only a run that succeeded has an answer; another's joiner text is reported, marked partial.
            "answer": self.answer if self.status == "succeeded" else None,
            "partial_answer": self.answer if self.status != "succeeded" else None,
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 8),
            "plan_versions": [
                {k: v[k] for k in ("version", "trigger", "model_started_at", "model_finished_at", "spliced_at",
                                   "added", "kept", "adopted", "cancelled")}
                for v in self.versions
            ],
            **({"speculation": self.speculation_summary()}
               if self.speculations or any(c.get("speculative") for c in self.model_calls) else {}),
            **({"reserved_unsettled": self.unsettled_summary()} if self.unsettled else {}),
        }

    def unsettled_summary(self) -> dict[str, Any]:
        """The model calls a crash left unsettled, counted in ``tokens`` and ``cost_usd`` at their reserved worst
        case: how many, their tokens and cost, and each (purpose, model, step, reservation id)."""
        return {
            "calls": len(self.unsettled),
            "tokens": sum(int(u.get("tokens", 0)) for u in self.unsettled.values()),
            "cost_usd": round(sum(float(u.get("cost_usd", 0.0)) for u in self.unsettled.values()), 8),
            "each": [{k: u.get(k) for k in ("reservation", "purpose", "model", "step", "tokens", "cost_usd")}
                     for u in self.unsettled.values()],
        }

    def speculation_summary(self) -> dict[str, Any]:
        """How the run speculated: attempts started, adopted, discarded (by reason), and their extra cost."""
        reasons: dict[str, int] = {}
        for entry in self.speculations:
            outcome = entry["outcome"]
            if outcome.startswith("discarded: "):
                reason = outcome.removeprefix("discarded: ").split(":")[0]
                reasons[reason] = reasons.get(reason, 0) + 1
        # Extra calls: the predictor's and the draft model's (their cost: extra_calls_cost_usd), and those of the
        # speculative attempts thrown away (their cost is the discards' extra_cost_usd); an adopted attempt's are the
        # step's own. An attempt's call belongs to the latest speculation of its step started by then.
        by_step: dict[str, list[dict[str, Any]]] = {}
        for e in self.speculations:
            by_step.setdefault(str(e["step"]), []).append(e)
        calls, call_cost = [], 0.0
        for c in self.model_calls:
            if not c.get("speculative"):
                continue
            if c.get("purpose") in ("predict", "draft"):
                calls.append(c)
                call_cost += float(c.get("cost_usd", 0.0))
                continue
            at = float(c.get("at", 0.0))
            mine = [e for e in by_step.get(str(c.get("step")), ()) if float(e["started_at"]) <= at]
            if not mine or mine[-1]["outcome"] != "adopted":
                calls.append(c)
        saved = 0.0  # each adopted attempt's head start: from its start to the real one (or to its end, if sooner)
        for e in self.speculations:
            if e["outcome"] == "adopted" and "real_start" in e:
                saved += max(0.0, min(e["real_start"], e["attempt_end"]) - float(e["started_at"]))
        return {"started": len(self.speculations),
                "adopted": sum(1 for e in self.speculations if e["outcome"] == "adopted"),
                "discarded": sum(reasons.values()), "discarded_by_reason": reasons,
                "interrupted": sum(1 for e in self.speculations if e["outcome"] == "interrupted"),
                "extra_cost_usd": round(self.speculation_cost_usd, 8),  # the discarded attempts' model calls
                "extra_model_calls": len(calls),
                "extra_tokens": sum(int(c.get("prompt_tokens", 0)) + int(c.get("completion_tokens", 0))
                                    for c in calls),
                "extra_calls_cost_usd": round(call_cost, 8),
                "total_extra_cost_usd": round(self.speculation_cost_usd + call_cost, 8),
                "head_start_s": round(saved, 6)}

    def counts(self) -> dict[str, int]:
        """How many steps are in each status (keys are ``StepStatus`` values; ``str`` for the views that print them)."""
        out: dict[str, int] = {}
        for rec in self.records.values():
            out[rec.status] = out.get(rec.status, 0) + 1
        return out


# The fold's dispatch table: every kind of the engine's events (engine/events.py ``EventKind``;
# tests/engine/test_state.py checks it holds exactly those) and the handler that applies it, each handler typed with
# its kind's payload (``PAYLOADS``). Keyed by ``str``, as ``Event.kind`` is: a kind no handler folds (a control run's,
# or a newer planweave's) is refused by ``apply``, naming it. Plain functions, called as ``fold(state, event, data)``:
# one dictionary lookup per event, no bound method built (the engine folds several events per step).
Fold = Callable[[RunState, Event, Any], Sequence[str]]
_FOLD: Mapping[str, Fold] = {
    "step_started": RunState._step_started,
    "step_succeeded": RunState._step_succeeded,
    "step_failed": RunState._step_failed,
    "step_cancelled": RunState._step_cancelled,
    "step_progress": RunState._step_progress,
    "run_created": RunState._run_created,
    "run_resumed": RunState._run_resumed,
    "run_cancel_requested": RunState._no_change,
    "run_cancelled": RunState._run_cancelled,
    "run_finished": RunState._run_finished,
    "plan_version": RunState._plan_version,
    "steps_added": RunState._steps_added,
    "model_call": RunState._model_call,
    "model_reserved": RunState._model_reserved,
    "model_released": RunState._model_released,
    "escalation": RunState._escalation,
    "answer": RunState._answer,
    "warning": RunState._no_change,
    "approval_requested": RunState._approval_requested,
    "approval_given": RunState._approval_given,
    "input_requested": RunState._input_requested,
    "input_given": RunState._input_given,
    "step_reply": RunState._step_reply,
    "allocation": RunState._no_change,
    "forecast": RunState._no_change,
    "speculation_started": RunState._speculation_started,
    "speculation_adopted": RunState._speculation_adopted,
    "speculation_discarded": RunState._speculation_discarded,
}
