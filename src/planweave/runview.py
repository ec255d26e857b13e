"""The read model of "a run in the journal", shared by the CLI and the server (no CLI or server imports).

``planweave runs --json`` and ``GET /runs`` list :func:`run_overview` items; ``planweave show RUN --json``,
``planweave run --json`` and ``GET /runs/{id}`` are :func:`run_report` objects (the CLI adds what only it knows: the
owner and each step's attempt log). Both edges fold the run's events with the engine's own
:class:`~planweave.engine.state.RunState`; what differs is only how they know the status of a run left ``running``
(the CLI: whether its process is alive; the server: also whether its own engine runs it), so the caller passes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planweave.engine.report import Redact, outputs_summary
from planweave.engine.state import RunState
from planweave.journal.base import Journal
from planweave.plan.defaults import unbounded_steps


def unbounded(state: RunState) -> list[str]:
    """The ``"unbounded"`` of the reports: the plan's steps that may wait forever (no timeout, or over a day)."""
    return unbounded_steps(state.plan.steps[sid] for sid in state.plan.order)


def run_overview(run_id: str, state: RunState | None, status: str, problem: str | None = None) -> dict[str, Any]:
    """One item of a run list: id, plan name, status, times, error, step counts, the steps waiting for a person
    (``{step: "waiting_approval" | "waiting_input"}``), the unbounded steps, tokens and cost.

    ``state`` None is a run whose events cannot be folded: ``problem`` says why (as ``error``).
    """
    if state is None:
        return {"run_id": run_id, "plan": None, "status": status, "started_at": None, "finished_at": None,
                "makespan_s": None, "error": problem, "steps": {}, "waiting": {}, "unbounded": [],
                "tokens": None, "cost_usd": None}
    summary = state.summary()
    return {
        "run_id": run_id,
        "plan": state.plan.spec.name or None,
        "status": status,
        "started_at": summary["started_at"],
        "finished_at": summary["finished_at"],
        "makespan_s": summary["makespan_s"],
        "error": summary["error"],
        "steps": state.counts(),
        "waiting": state.waiting_steps(),
        "unbounded": unbounded(state),
        "tokens": summary["tokens"],
        "cost_usd": summary["cost_usd"],
    }


def run_report(
    state: RunState, status: str | None = None, outputs: Mapping[str, Any] | None = None,
    redact: Redact | None = None,
) -> dict[str, Any]:
    """One run in full: :meth:`RunState.summary` (steps, tokens, cost, answer, plan versions) with ``status``
    overriding the fold's when given, plus the plan name, root cause, waiting and unbounded steps, each step's
    ``duration_s`` (first start to end, None until it ends) and ``attempt_log``, and, given ``outputs``,
    ``"outputs"`` as :func:`~planweave.engine.report.outputs_summary` shows them (redacted)."""
    report = state.summary()
    for sid, step in report["steps"].items():
        rec = state.records[sid]
        start, end = rec.started_at, rec.finished_at
        step["duration_s"] = end - start if start is not None and end is not None else None
        step["attempt_log"] = [
            {"attempt": a, "started_at": s, "finished_at": f, "outcome": o} for a, s, f, o in rec.attempt_log
        ]
    if status is not None:
        report["status"] = status
    report["plan"] = state.plan.spec.name or None
    report["root_cause"] = state.root_cause
    report["waiting"] = state.waiting_steps()
    report["unbounded"] = unbounded(state)
    if outputs is not None:
        report["outputs"] = outputs_summary(state, outputs, redact=redact)
    return report


async def stored_outputs(journal: Journal, state: RunState) -> dict[str, Any]:
    """The outputs of the succeeded steps of ``state`` as the journal stores them (one read of their blobs)."""
    refs = {sid: rec.output_ref for sid, rec in state.records.items()
            if rec.status == "succeeded" and rec.output_ref is not None}
    blobs = await journal.get_blobs(set(refs.values()))
    return {sid: blobs[ref] for sid, ref in refs.items() if ref in blobs}
