"""``planweave serve --queue``: POST /runs records a plan in the journal's run queue for the workers, and returns.

The server then runs nothing itself: ``planweave worker`` processes sharing the PostgreSQL journal claim the runs.
``GET /workers`` lists the workers, the runs each holds and their leases' ages (the dashboard shows it), and
``GET /queue/{run_id}`` a submitted run's place in the queue (before a worker claims it, ``GET /runs/{id}`` has
nothing to show).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

from planweave.core.errors import PlanInvalid, PlanProblem, RunNotFound
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import validate_plan
from planweave.core.plan.model import PlanSpec
from planweave.journal.leases import LeaseStore, LeaseView, QueuedRun
from planweave.tools.safety import SecretRedactor

__all__ = ["QUEUE_SOURCE", "queue_plan", "queued_run", "worker_listing"]

#: The ``source`` of runs queued over HTTP (not ``POST /runs``: a server's recovery must not resume them, the
#: workers hold them).
QUEUE_SOURCE = "POST /runs (queued)"


async def queue_plan(store: LeaseStore, spec: PlanSpec, run_id: str | None, tools: ToolCatalog,
                     capacities: dict[str, int], *, deadline: float | None, priority: float = 0.0) -> str:
    """Check ``spec`` against the server's tools (the workers are given the same) and queue it; its run id."""
    if deadline is not None:
        raise PlanInvalid([PlanProblem("", "deadline", "a queued run has no deadline: the workers do not enforce "
                                                       "one (start the server without --queue to use it)")],
                          QUEUE_SOURCE)
    plan = validate_plan(spec, tools, {**spec.capacities, **capacities}, source=QUEUE_SOURCE)
    rid = run_id or uuid.uuid4().hex[:12]
    queued = QueuedRun(rid, plan.to_document(), QUEUE_SOURCE, {"priority": priority} if priority else {})
    await store.submit(queued.sealed(SecretRedactor()))  # as `planweave submit`: the worker puts the secrets back
    return rid


def _lease(view: LeaseView) -> dict[str, Any]:
    return asdict(view)


async def worker_listing(store: LeaseStore) -> dict[str, Any]:
    """``GET /workers``: every worker not stopped, with the runs it holds, and the queue's counts by state."""
    counts: dict[str, int] = {}
    for lease in await store.leases():
        key = lease.state if lease.state != "done" else f"done/{lease.outcome}"
        counts[key] = counts.get(key, 0) + 1
    workers = [{**asdict(w), "alive": w.alive, "runs": [_lease(r) for r in w.runs]}
               for w in await store.workers() if not w.stopped]
    return {"runs": counts, "workers": workers}


async def queued_run(store: LeaseStore, run_id: str) -> dict[str, Any]:
    """``GET /queue/{run_id}``: the run's queue row; raises RunNotFound (404) if it was never queued."""
    try:
        return _lease(await store.state(run_id))
    except RunNotFound:
        raise RunNotFound(f"run '{run_id}' was not queued") from None
