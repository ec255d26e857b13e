"""People's replies to a waiting step: the first one is final, and this names the one that stands (pure).

A step waits for one reply at a time (an approval, or a ``human.input`` value). A reply comes in-process
(``Run.approve``/``Run.send``: ``approval_given``/``input_given`` at once) or from another process (``step_reply``,
which the run's process applies, or a resume). Whatever came first stands; every later reply is refused naming it,
by the journal (a ``step_reply`` is written only when none stands, the check and the write in one transaction), by
the run (``Run.approve``/``Run.send``) and by the CLI and HTTP edges. docs/people.md says who may reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from planweave.core.errors import ReplyRefused
from planweave.core.events import Event

__all__ = ["GIVEN_KINDS", "REPLY_KINDS", "decision_of", "describe_reply", "refusal", "reply_events", "standing_reply"]

#: The events that apply a reply (the run's own record of a decision).
GIVEN_KINDS = frozenset({"approval_given", "input_given"})
#: The events :func:`standing_reply` reads: the requests that open a wait, the replies, the decisions.
REPLY_KINDS = ("approval_requested", "input_requested", "step_reply", "approval_given", "input_given")
_VALUE_CHARS = 200


def standing_reply(events: Iterable[Event]) -> Event | None:
    """The reply that stands for a step's current wait, from the step's events in journal order; None if none does.

    It is the decision the run applied since the wait began (``approval_given``/``input_given``), else the first
    ``step_reply`` journaled since the last decision, which the run applies when it can. A new request opens a new
    wait (a retried ``human.input``) but keeps a reply journaled and not yet applied: a resumed run asks again and
    applies it.
    """
    decision: Event | None = None
    pending: Event | None = None
    for event in events:
        kind = event.kind
        if kind == "approval_requested" or kind == "input_requested":
            decision = None
        elif kind == "step_reply":
            if pending is None and decision is None:
                pending = event
        elif kind in GIVEN_KINDS:
            decision, pending = event, None
    return decision if decision is not None else pending


def reply_events(events: Iterable[Event], step: str | None) -> list[Event]:
    """The events of ``step`` that :func:`standing_reply` reads, in order."""
    return [e for e in events if e.step == step and e.kind in REPLY_KINDS]


def decision_of(event: Event) -> dict[str, Any]:
    """The reply ``event`` carries, as ``ReplyRefused.decision`` and the HTTP 409 body show it."""
    data = event.data
    found: dict[str, Any] = {"by": data.get("by"), "at": event.at, "applied": event.kind in GIVEN_KINDS}
    if "value" in data:
        found["value"] = data["value"]
    else:
        found["approve"] = bool(data.get("approve"))
        found["reason"] = data.get("reason")
    return found


def describe_reply(event: Event) -> str:
    """``rejected ('freeze week') by alice@ci-3 at 2026-12-04T23:31:02Z`` (and whether it is applied yet)."""
    data = event.data
    if "value" in data:
        text = json.dumps(data["value"], ensure_ascii=False, default=str)
        what = f"the value {text[:_VALUE_CHARS] + '...' if len(text) > _VALUE_CHARS else text}"
    else:
        what = "approved" if data.get("approve") else "rejected"
        if data.get("reason"):
            what += f" ({data['reason']!r})"
    by = data.get("by") or "an unnamed caller"
    when = datetime.fromtimestamp(event.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pending = "" if event.kind in GIVEN_KINDS else " (journaled, not applied yet)"
    return f"{what} by {by} at {when}{pending}"


def refusal(run_id: str, step: str, standing: Event) -> ReplyRefused:
    """The error for a reply to ``step`` that comes after ``standing``."""
    return ReplyRefused(f"step '{step}' of run '{run_id}' already has a reply, and the first reply is final: "
                        f"{describe_reply(standing)}", decision_of(standing))
