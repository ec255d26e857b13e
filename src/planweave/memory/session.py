"""Memory for one goal run from the CLI (``planweave goal``): recall before planning, learn after the run ends.

``learn`` runs once the goal run has ended and its engine has closed: it opens the journal again (the same URL, so
the memory store and the replay runs live beside the run), asks the distillation model for candidates and verifies
each on a fresh engine with the same tools (a replay or a check is a run in the journal, source ``memory``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planweave.core.plan.catalog import ToolCatalog
from planweave.core.state import RunState
from planweave.memory.distill import FinishedRun, distill
from planweave.memory.model import MemoryEntry
from planweave.memory.store import open_memory_store
from planweave.memory.verify import verify_all

if TYPE_CHECKING:
    from planweave.models import Endpoint

__all__ = ["Learned", "learn"]


@dataclass(frozen=True)
class Learned:
    """What a run left in memory: the entries after verification and the distiller's refused lines."""

    entries: tuple[MemoryEntry, ...]
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"entries": [{"id": e.id, "kind": e.kind, "name": e.name, "version": e.version, "status": e.status,
                             "note": e.note} for e in self.entries], "problems": list(self.problems)}


async def learn(url: str, model: str, endpoint: Endpoint | str | None, goal: str, run_id: str, status: str,
                error: str | None, state: RunState, outputs: Mapping[str, Any], tools: ToolCatalog) -> Learned:
    """Distil the ended run ``run_id`` with ``model`` (at ``endpoint``: the run's, or a base URL) into candidates in
    the memory store of the journal at ``url`` and verify them with ``tools``; returns what was stored and how
    verification went."""
    from planweave import open_engine
    from planweave.models import Endpoint, resolve_model

    at = endpoint if isinstance(endpoint, Endpoint) else Endpoint(base_url=endpoint)
    finished = FinishedRun(run_id, status, error, state, outputs)
    async with resolve_model(model, endpoint=at) as client, open_memory_store(url) as store:
        distilled = await distill(client, store, goal, finished)
        async with open_engine(url, tools=tools) as engine:
            verified = await verify_all(engine, store, list(distilled.entries), tools=tools)
    return Learned(tuple(verified), distilled.problems)
