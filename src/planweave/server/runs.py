"""Runs as the journal tells them, folded incrementally for the HTTP API, and the recovery of orphaned runs.

:class:`RunIndex` reads only the events appended since its last refresh (``journal.read(None, after=pos)``) and
applies them with the engine's own fold (:class:`~planweave.core.state.RunState`), so ``GET /runs`` costs the
new events, not the whole journal, and shows runs that other processes write to the same journal too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from planweave.core.errors import JournalError, PlanweaveError, RunNotFound
from planweave.core.events import Event
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.core.plan.model import PlanSpec
from planweave.core.state import RunState
from planweave.engine.runtime import Engine, Run, process_alive
from planweave.journal.base import Journal
from planweave.runview import run_overview, run_report, stored_outputs

__all__ = [  # run_report and stored_outputs are planweave.runview's, the one read model the CLI shares
    "HTTP_SOURCE", "IndexedRun", "RunIndex", "active_run", "owner_gone", "plan_from_document", "plan_view",
    "recover_orphans", "run_report", "stored_outputs",
]

log = logging.getLogger("planweave.server")

#: ``source`` of runs submitted with ``POST /runs``: those are the runs a restarted server resumes.
HTTP_SOURCE = "POST /runs"


def plan_from_document(raw: Any, version: int, source: str) -> Plan:
    """Validate a journaled plan (a document, or a PlanSpec in memory journals) without tool or capacity checks."""
    spec = raw if isinstance(raw, PlanSpec) else parse_plan_document(raw, source)
    return validate_plan(spec, None, None, version=version, source=source)


@dataclass
class IndexedRun:
    """One run of the journal: its folded state (None if its events cannot be folded) and who ran it last."""

    run_id: str
    state: RunState | None = None
    owner: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    origin: str = ""  # a goal run's options.limits.origin: HTTP_SOURCE when POST /runs started it
    problem: str | None = None
    last_at: float | None = None
    #: Earlier plan versions as they were when a later one replaced them (the current one is ``state.plan``).
    plans: dict[int, Plan] = field(default_factory=dict)

    def apply(self, event: Event, plan: Plan | None = None) -> None:
        """Fold one more event; a run whose events cannot be folded is marked unreadable, not raised.

        ``plan``: for ``run_created``, its plan already validated (a run this process runs), so that a 10,000-step
        plan is not validated again (0.6 s of a server's event loop) when the index first sees it."""
        self.last_at = event.at
        if self.problem is not None:
            return
        try:
            if event.kind == "run_created":
                self.state = RunState(
                    self.run_id,
                    plan if plan is not None else
                    plan_from_document(event.data["plan"], int(event.data.get("version", 1)), f"run '{self.run_id}'"),
                    event.data.get("idempotent", ()),
                )
                self.source = str(event.data.get("source", ""))
                limits = (event.data.get("options") or {}).get("limits") or {}
                self.origin = str(limits.get("origin") or "") if isinstance(limits, Mapping) else ""
            if self.state is None:
                raise JournalError(f"run '{self.run_id}': first event is {event.kind}, not run_created")
            if event.kind in ("run_created", "run_resumed"):
                self.owner = dict(event.data.get("owner") or {})
            elif event.kind == "plan_version":
                self.plans[self.state.plan.version] = self.state.plan
            self.state.apply(event)
        except (PlanweaveError, KeyError, TypeError, ValueError) as exc:
            self.problem = f"cannot read this run: {exc}"
            self.state = None


def owner_gone(owner: Mapping[str, Any], engine: Engine, run_id: str) -> bool:
    """Whether the process that last ran ``run_id`` is gone (a run it left ``running`` was interrupted).

    This process counts as gone unless its engine is running the run: a previous engine in the same process (or a
    restarted server that got the same pid) left it behind.
    """
    if not owner:
        return True
    if owner.get("host") == socket.gethostname() and owner.get("pid") == os.getpid():
        return active_run(engine, run_id) is None
    return not process_alive(owner)


def active_run(engine: Engine, run_id: str) -> Run | None:
    """The run if ``engine`` is running it now (started or resumed and not finished), else None."""
    try:
        run = engine.get(run_id)
    except RunNotFound:
        return None
    return None if run.finished else run


_CREATED_KEPT = 64


class RunIndex:
    """Every run of a journal, kept folded: :meth:`refresh` applies the events appended since the last one."""

    def __init__(self, journal: Journal, engine: Engine) -> None:
        self._journal = journal
        self._engine = engine
        self._runs: dict[str, IndexedRun] = {}
        self._pos = 0
        self._lock = asyncio.Lock()
        # The validated plans of the runs this engine created, until the index folds their run_created (a run that
        # has already ended included): at most _CREATED_KEPT, the oldest dropped.
        self._created: dict[str, Plan] = {}
        engine.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.kind != "run_created":
            return
        run = active_run(self._engine, event.run_id)
        if run is None:
            return
        self._created[event.run_id] = run.state.plan
        while len(self._created) > _CREATED_KEPT:
            del self._created[next(iter(self._created))]

    @property
    def position(self) -> int:
        """The journal position of the last event folded (a stream started after it misses nothing)."""
        return self._pos

    async def refresh(self) -> int:
        """Fold the events stored since the last refresh; return the journal position reached."""
        async with self._lock:
            for event in await self._journal.read(None, after=self._pos):
                run = self._runs.get(event.run_id)
                if run is None:
                    run = self._runs[event.run_id] = IndexedRun(event.run_id)
                run.apply(event, self._live_plan(event) if event.kind == "run_created" else None)
                if event.pos is not None:
                    self._pos = event.pos
            return self._pos

    def _live_plan(self, created: Event) -> Plan | None:
        """The validated plan of ``created``'s run if this process created or runs it, at that version (plans are
        immutable): a 10,000-step plan is validated again in 0.6-1 s."""
        version = int(created.data.get("version", 1))
        plan = self._created.pop(created.run_id, None)
        if plan is not None and plan.version == version:
            return plan
        run = active_run(self._engine, created.run_id)
        if run is None or run.state.plan.version != version:
            return None
        return run.state.plan

    def get(self, run_id: str) -> IndexedRun | None:
        return self._runs.get(run_id)

    def runs(self) -> list[IndexedRun]:
        """The runs in the order they first appeared in the journal."""
        return list(self._runs.values())

    def status(self, run: IndexedRun) -> str:
        """The folded status, ``interrupted`` for a ``running`` run whose process is gone, ``unreadable`` if broken."""
        if run.state is None:
            return "unreadable"
        if run.state.status == "running" and owner_gone(run.owner, self._engine, run.run_id):
            return "interrupted"
        return run.state.status

    def overview(self, run: IndexedRun) -> dict[str, Any]:
        """The ``GET /runs`` item (as ``planweave runs --json``): :func:`planweave.runview.run_overview`."""
        return run_overview(run.run_id, run.state, self.status(run), run.problem)

    def orphans(self) -> list[str]:
        """Runs submitted over HTTP (plans, and goals a server planned) that the journal shows running but whose
        process is gone: to resume."""
        return [
            run.run_id for run in self._runs.values()
            if (run.source == HTTP_SOURCE or (run.source == "goal" and run.origin == HTTP_SOURCE))
            and self.status(run) == "interrupted"
        ]


#: The steps of recently viewed plans as GET /runs/{id}/plan shows them, but for their status: a plan version never
#: changes, so a 10,000-step plan's views are built once (0.15 s), not per request. Keyed by the plan's id, the plan
#: kept beside them (so the id is not reused while it is cached); the oldest dropped beyond _VIEWED_PLANS.
_step_views_cache: dict[int, tuple[Plan, list[dict[str, Any]]]] = {}
_VIEWED_PLANS = 16


def _step_views(plan: Plan) -> list[dict[str, Any]]:
    """``plan``'s steps in order with their tool, dependencies, description, estimate and rank (no status)."""
    cached = _step_views_cache.get(id(plan))
    if cached is not None and cached[0] is plan:
        return cached[1]
    views = [
        {
            "id": sid,
            "tool": step.tool,
            "deps": list(plan.deps[sid]),
            "description": step.description,
            "estimate": step.estimate.model_dump() if step.estimate is not None else None,
            "rank": plan.rank[sid],
        }
        for sid, step in ((sid, plan.steps[sid]) for sid in plan.order)
    ]
    _step_views_cache[id(plan)] = (plan, views)
    while len(_step_views_cache) > _VIEWED_PLANS:
        del _step_views_cache[next(iter(_step_views_cache))]
    return views


def plan_view(state: RunState, plan: Plan) -> dict[str, Any]:
    """The ``GET /runs/{id}/plan`` object: ``plan``'s steps with dependencies and status, its critical path, and
    every plan version of the run (trigger, time and diff).

    For an earlier version, a step's status is the one it had when a later version replaced it.
    """
    retired = {rec.id: rec for version, rec in state.retired if version == plan.version}
    records = state.records

    def status(sid: str) -> str:
        rec = retired.get(sid) or records.get(sid)
        return rec.status if rec is not None else "pending"

    return {
        "run_id": state.run_id,
        "version": plan.version,
        "current_version": state.plan.version,
        "versions": [
            {k: v.get(k) for k in ("version", "parent", "trigger", "spliced_at", "added", "kept", "adopted",
                                   "cancelled", "dropped")}
            for v in state.versions
        ],
        "name": plan.spec.name,
        "goal": plan.spec.goal,
        "steps": [{**view, "status": status(view["id"])} for view in _step_views(plan)],
        "critical_path": list(plan.critical_path),
        "makespan_lower_bound": plan.makespan_lower_bound,
    }


async def recover_orphans(engine: Engine, index: RunIndex,
                          resume: Callable[[str], Awaitable[Run]] | None = None) -> list[str]:
    """Resume the HTTP-submitted runs left ``running`` by a process that is gone; return the ids resumed.

    ``resume`` resumes one run (default :meth:`Engine.resume`; the server's applies the run's journaled limits).

    A run that cannot be resumed (its tools are missing here, its journal is damaged) is logged and skipped: one
    broken run must not keep the server from starting.
    """
    await index.refresh()
    resumed = []
    for run_id in index.orphans():
        try:
            await (resume or engine.resume)(run_id)
        except PlanweaveError as exc:
            log.warning("could not resume run %s after a restart: %s", run_id, exc)
            continue
        log.info("resumed run %s, interrupted when its server stopped", run_id)
        resumed.append(run_id)
    return resumed
