"""The read model of "a run in the journal", shared by the CLI and the server (no CLI or server imports).

``planweave runs --json`` and ``GET /runs`` list :func:`run_overview` items; ``planweave show RUN --json``,
``planweave run --json`` and ``GET /runs/{id}`` are :func:`run_report` objects (the CLI adds what only it knows: the
owner and each step's attempt log). Both edges fold the run's events with the engine's own
:class:`~planweave.core.state.RunState`; what differs is only how they know the status of a run left ``running``
(the CLI: whether its process is alive; the server: also whether its own engine runs it), so the caller passes it.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from planweave.core.plan.defaults import unbounded_steps
from planweave.core.state import RunState
from planweave.engine.report import Redact, outputs_summary
from planweave.journal.base import Journal
from planweave.journal.summary import RunQuery, RunSummary

#: The statuses a run list shows and filters by: the stored ones, plus ``interrupted`` (running, its process gone).
SHOWN_STATUSES = ("running", "interrupted", "succeeded", "failed", "cancelled", "unreadable")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def unbounded(state: RunState) -> list[str]:
    """The ``"unbounded"`` of the reports: the plan's steps that may wait forever (no timeout, or over a day)."""
    return unbounded_steps(state.plan.steps[sid] for sid in state.plan.order)


def run_overview(run_id: str, state: RunState | None, status: str, problem: str | None = None) -> dict[str, Any]:
    """One item of a run list: id, name (``plan``: the plan's, or a goal run's goal cut to fit), status, times,
    error, step counts, the steps waiting for a person (``{step: "waiting_approval" | "waiting_input"}``), the
    unbounded steps, tokens and cost.

    ``state`` None is a run whose events cannot be folded: ``problem`` says why (as ``error``).
    """
    if state is None:
        return {"run_id": run_id, "plan": None, "status": status, "started_at": None, "finished_at": None,
                "makespan_s": None, "error": problem, "steps": {}, "waiting": {}, "unbounded": [],
                "tokens": None, "cost_usd": None}
    summary = state.summary()
    return {
        "run_id": run_id,
        "plan": state.plan.spec.shown_name(),
        "status": status,
        "started_at": summary["started_at"],
        "finished_at": summary["finished_at"],
        "makespan_s": summary["makespan_s"],
        "error": summary["error"],
        "steps": state.counts(),
        "waiting": state.waiting_steps(),
        "unbounded": unbounded(state),
        "tokens": summary["tokens"],
        "cost_usd": shown_cost(state, summary["cost_usd"])[0],
    }


def run_report(
    state: RunState, status: str | None = None, outputs: Mapping[str, Any] | None = None,
    redact: Redact | None = None,
) -> dict[str, Any]:
    """One run in full: :meth:`RunState.summary` (steps, tokens, cost, answer, plan versions) with ``status``
    overriding the fold's when given, plus ``ran_s`` (the time it ran: ``makespan_s``, the wall-clock span, less
    the downtime before each resume), the name (``plan``, as :func:`run_overview`'s), root cause, waiting and
    unbounded steps, each step's ``duration_s`` (first start to end, None until it ends) and ``attempt_log``, and,
    given ``outputs``, ``"outputs"`` as :func:`~planweave.engine.report.outputs_summary` shows them (redacted)."""
    report = state.summary()
    report["cost_usd"], unpriced = shown_cost(state, report["cost_usd"])
    if unpriced:
        report["unpriced_models"] = unpriced
    for sid, step in report["steps"].items():
        rec = state.records[sid]
        start, end = rec.started_at, rec.finished_at
        step["duration_s"] = end - start if start is not None and end is not None else None
        step["attempt_log"] = [
            {"attempt": a, "started_at": s, "finished_at": f, "outcome": o} for a, s, f, o in rec.attempt_log
        ]
    if status is not None:
        report["status"] = status
    # makespan_s is the wall-clock span: a resumed run's also holds the time no process ran it; ran_s does not.
    report["ran_s"] = state.ran_s(state.created_at, state.finished_at)
    report["plan"] = state.plan.spec.shown_name()
    report["root_cause"] = state.root_cause
    report["waiting"] = state.waiting_steps()
    report["unbounded"] = unbounded(state)
    if outputs is not None:
        report["outputs"] = outputs_summary(state, outputs, redact=redact)
    return report


def shown_cost(state: RunState, cost_usd: float) -> tuple[float | None, list[str]]:
    """The run's cost as the reports show it, and the models without a price whose calls used tokens: with any,
    the cost is unknown (None), not the sum of what was billed (those calls were billed nothing)."""
    if not state.model_calls:
        return cost_usd, []
    from planweave.models.pricing import unpriced_calls

    unpriced = unpriced_calls(state.model_calls)
    return (None if unpriced else cost_usd), unpriced


async def stored_outputs(journal: Journal, state: RunState) -> dict[str, Any]:
    """The outputs of the succeeded steps of ``state`` as the journal stores them (one read of their blobs)."""
    refs = {sid: rec.output_ref for sid, rec in state.records.items()
            if rec.status == "succeeded" and rec.output_ref is not None}
    blobs = await journal.get_blobs(set(refs.values()))
    return {sid: blobs[ref] for sid, ref in refs.items() if ref in blobs}


def summary_overview(summary: RunSummary, status: str) -> dict[str, Any]:
    """The :func:`run_overview` item of a run from its journal summary (the same keys; no events are folded)."""
    makespan = None
    if summary.started_at is not None and summary.finished_at is not None:
        makespan = summary.finished_at - summary.started_at
    return {
        "run_id": summary.run_id, "plan": summary.plan, "status": status, "started_at": summary.started_at,
        "finished_at": summary.finished_at, "makespan_s": makespan, "error": summary.error,
        "steps": dict(summary.steps), "waiting": dict(summary.waiting), "unbounded": list(summary.unbounded),
        "tokens": summary.tokens, "cost_usd": summary.cost_usd,
    }


def check_statuses(statuses: Collection[str]) -> frozenset[str]:
    """``statuses`` as a set; raises ValueError naming an unknown one and the known ones."""
    wanted = frozenset(statuses)
    unknown = sorted(wanted - set(SHOWN_STATUSES))
    if unknown:
        raise ValueError(f"unknown run status {', '.join(map(repr, unknown))}: use {', '.join(SHOWN_STATUSES)}")
    return wanted


def parse_since(text: str, now: float) -> float:
    """``--since``/``since=`` as epoch seconds: an age (``90s``, ``30m``, ``2h``, ``7d``, ``1w``: that long before
    ``now``), an ISO date or time (``2026-12-01``, ``2026-12-01T08:00``; UTC unless it says), or epoch seconds.

    Raises ValueError saying what is accepted.
    """
    text = text.strip()
    match = _DURATION.fullmatch(text)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"since {text!r} is not an age (30m, 2h, 7d) or an ISO date or time "
                         "(2026-12-01, 2026-12-01T08:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return when.timestamp()


class RunList(NamedTuple):
    """A page of run-list items, the cursor of the next page (None: none) and the journal position it is current
    to (follow ``GET /events`` from there)."""

    rows: list[dict[str, Any]]
    next: int | None
    position: int


async def list_overviews(
    journal: Journal, status_of: Callable[[RunSummary], str], *, statuses: Collection[str] | None = None,
    since: float | None = None, limit: int | None = None, cursor: int | None = None,
    skip: Callable[[Sequence[str]], Awaitable[Collection[str]]] | None = None,
) -> RunList:
    """A page of run-list items (:func:`summary_overview`), newest first: a :class:`RunList`.

    ``status_of`` is the status shown for a summary (the edges tell ``interrupted`` from ``running`` by whether the
    run's process is alive); ``statuses`` filters by it (checked: ValueError names an unknown one). The journal
    reads only the runs shown (plus, for ``interrupted``, the running ones it skips). ``skip`` names, of each page's
    run ids, the ones to leave out (``runs``: the sub-plans' child runs); like a status filter, the pages go on until
    ``limit`` rows are shown or the journal has no more.
    """
    wanted = None if statuses is None else check_statuses(statuses)
    stored = None if wanted is None else frozenset("running" if s == "interrupted" else s for s in wanted)
    rows: list[dict[str, Any]] = []
    before = cursor
    position: int | None = None
    while True:
        page = await journal.list_runs(RunQuery(stored, since, before, limit))
        position = page.position if position is None else position
        skipped = () if skip is None else await skip([s.run_id for s in page.runs])
        for i, summary in enumerate(page.runs):
            if summary.run_id in skipped:
                continue
            shown = status_of(summary)
            if wanted is not None and shown not in wanted:
                continue
            rows.append(summary_overview(summary, shown))
            if limit is not None and len(rows) == limit:
                more = i + 1 < len(page.runs) or page.next is not None
                return RunList(rows, summary.seq if more else None, position)
        if page.next is None:
            return RunList(rows, None, position)
        before = page.next
