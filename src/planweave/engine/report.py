"""The read model of one run for people and clients: step outputs and the detail of one step (no I/O).

Both edges use it: the CLI (``run --json``, ``show``, ``output``) and the server (``GET /runs/{id}/steps/{step}``)
build what they show from a :class:`~planweave.core.state.RunState`, the outputs of its succeeded steps (live, or
loaded from the journal's blobs) and optionally the run's events. Everything returned is redacted by the ``redact``
the caller passes (e.g. ``functools.partial(tools.safety.redact, secrets=...)``) and JSON-ready.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from planweave.core.errors import PlanweaveError, did_you_mean
from planweave.core.events import Event
from planweave.core.plan.refs import RefResolutionError, render
from planweave.core.state import RunState, StepRecord
from planweave.journal.base import OutputNotSerialisable, encode_blob

DEFAULT_OUTPUT_LIMIT = 256 * 1024  # bytes of canonical JSON above which a shown output is replaced by a marker

Redact = Callable[[Any], Any]


class StepNotFound(PlanweaveError, LookupError):
    """The run has no step with the given id (in its current plan version)."""


def _same(value: Any) -> Any:
    return value


def shown_output(value: Any, *, limit: int | None = DEFAULT_OUTPUT_LIMIT, redact: Redact | None = None) -> Any:
    """``value`` redacted, or ``{"truncated": true, "bytes": N, "sha256": ...}`` if its JSON is above ``limit`` bytes.

    ``bytes`` and ``sha256`` are those of the journal's canonical encoding of the redacted value, so for an output the
    engine stored (already redacted) ``sha256`` is its blob reference. ``limit=None`` never truncates.
    """
    value = (redact or _same)(value)
    if limit is None:
        return value
    try:
        digest, data = encode_blob(value)
    except OutputNotSerialisable:
        return value  # only live values can be like this; the caller's JSON encoder decides
    if len(data) <= limit:
        return value
    return {"truncated": True, "bytes": len(data), "sha256": digest}


def outputs_summary(
    state: RunState, outputs: Mapping[str, Any], *, limit: int | None = DEFAULT_OUTPUT_LIMIT,
    redact: Redact | None = None,
) -> dict[str, Any]:
    """``{step_id: output}`` for the succeeded steps of ``state`` whose output is in ``outputs``, in plan order.

    Outputs above ``limit`` bytes are replaced by the marker of :func:`shown_output`; ``planweave output RUN STEP``
    (or :func:`step_detail` with ``limit=None``) gives the whole value.
    """
    out: dict[str, Any] = {}
    for sid in state.plan.order:
        if state.records[sid].status == "succeeded" and sid in outputs:
            out[sid] = shown_output(outputs[sid], limit=limit, redact=redact)
    return out


def find_step(state: RunState, step_id: str) -> StepRecord:
    """The record of ``step_id``; raises StepNotFound naming the run and the closest step id."""
    rec = state.records.get(step_id)
    if rec is None:
        hint = did_you_mean(step_id, state.records)
        raise StepNotFound(f"run '{state.run_id}' has no step '{step_id}'{hint}")
    return rec


def rendered_args(state: RunState, outputs: Mapping[str, Any], step_id: str) -> tuple[Any, bool]:
    """The arguments ``step_id`` is (or was, or would be) called with, and whether every reference was resolved.

    References are resolved against ``outputs``; while one cannot be (its step has not succeeded), the arguments are
    shown as written in the plan, ``${...}`` included. A step running its fallback shows the fallback's arguments.
    """
    plan = state.plan
    step = plan.steps[step_id]
    use_fallback = state.records[step_id].fallback_active and step.fallback is not None
    template = plan.fallbacks[step_id] if use_fallback else plan.templates[step_id]
    if all(ref.step in outputs for ref in plan.refs[step_id]):
        try:
            return render(template, outputs), True
        except RefResolutionError:
            pass  # the output is there but not the path: show what the plan says
    written = step.fallback.args if use_fallback and step.fallback is not None else step.args
    return written, False


def _attempts(rec: StepRecord, events: Iterable[Event]) -> list[dict[str, Any]]:
    errors: dict[int, tuple[str | None, str | None]] = {}
    cached: dict[int, Any] = {}  # attempt -> where the result cache's output came from (docs/caching.md)
    for event in events:
        if event.step == rec.id and event.kind == "step_failed":
            errors[int(event.data.get("attempt", 0))] = (event.data.get("error"), event.data.get("kind"))
        elif event.step == rec.id and event.kind == "step_succeeded" and "cache" in event.data:
            cached[int(event.data.get("attempt", 0))] = event.data["cache"]
    out = []
    for attempt, started, finished, outcome in rec.attempt_log:
        error, kind = errors.get(attempt, (None, None))
        out.append({"attempt": attempt, "started_at": started, "finished_at": finished, "outcome": outcome,
                    "error": error, "error_kind": kind, **({"cache": cached[attempt]} if attempt in cached else {})})
    return out


def step_detail(
    state: RunState, outputs: Mapping[str, Any], step_id: str, *, events: Iterable[Event] = (),
    limit: int | None = DEFAULT_OUTPUT_LIMIT, redact: Redact | None = None,
) -> dict[str, Any]:
    """One step as ``show --step`` and ``GET /runs/{id}/steps/{step}`` give it; raises StepNotFound.

    Keys: ``step``, ``tool``, ``status``, ``attempts`` (one object per attempt: times, outcome, and with ``events``
    the error of each failed attempt and the ``cache`` source of one served from the result cache), ``args`` (see
    :func:`rendered_args`) and ``args_resolved``, ``output`` (None unless the step succeeded; the marker of
    :func:`shown_output` above ``limit``), ``error`` and ``error_kind`` (of the last failure), ``started_at``,
    ``finished_at``. Every value passes through ``redact``.
    """
    rec = find_step(state, step_id)
    clean = redact or _same
    args, resolved = rendered_args(state, outputs, step_id)
    has_output = rec.status == "succeeded" and step_id in outputs
    detail = {
        "step": step_id,
        "tool": state.plan.steps[step_id].tool,
        "status": rec.status,
        "attempts": _attempts(rec, events),
        "args": args,
        "args_resolved": resolved,
        "output": shown_output(outputs[step_id], limit=limit, redact=clean) if has_output else None,
        "error": rec.error,
        "error_kind": rec.error_kind,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
    }
    redacted: dict[str, Any] = clean(detail)
    return redacted
