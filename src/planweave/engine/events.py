"""Events: every state change of a run, as appended to the journal (pure data)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

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
    "escalation",  # data: rung (retry|fallback|local_repair|global_replan|fail), step, reason
    "answer",  # data: text (the run's final answer, from the joiner)
    "warning",  # data: message, blocked_s, tool, where (a tool blocked the event loop); changes no state
    "step_progress",  # data: fraction, message (reported by a long-running tool)
    "approval_requested",  # data: prompt (the step's approval text, or null)
    "approval_given",  # data: approve, reason
    "input_requested",  # data: prompt, schema (a JSON schema or null), written by the human.input tool
    "input_given",  # data: value
    "step_reply",  # data: approve, reason | value (a person's answer, written by another process)
]


class Event(NamedTuple):
    """One journaled state change; ``pos`` is the journal's global position, set when it is stored.

    A NamedTuple rather than a frozen dataclass: events are created on the engine's hot path, several per step.
    """

    run_id: str
    kind: EventKind
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
