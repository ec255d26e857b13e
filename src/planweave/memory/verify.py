"""Admission only after verification: a skill's sub-plan is replayed through the engine, a lesson's check step is
run; success admits the entry, failure rejects it (kept for audit, never retrieved). A lesson without a check waits
for a person (``planweave memory admit ID``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planweave.engine.runtime import Engine
from planweave.errors import PlanweaveError
from planweave.memory.model import MemoryEntry, MemoryStoreError, instantiate
from planweave.memory.store import MemoryStore
from planweave.plan.catalog import ToolCatalog

__all__ = ["REPLAY_SOURCE", "admit_by_person", "verification_plan", "verify", "verify_all"]

REPLAY_SOURCE = "memory"  # run_created's source of a replay or a check run (planweave runs shows it)


def verification_plan(entry: MemoryEntry) -> dict[str, Any] | None:
    """The plan that verifies ``entry``: a skill's steps with its recorded parameters, a lesson's check step; None
    for a lesson without a check (a person admits it)."""
    if entry.kind == "skill":
        return {"steps": instantiate(entry.steps, entry.params)}
    if entry.check is not None:
        return {"steps": [{"id": "check", **dict(entry.check)}]}
    return None


async def verify(engine: Engine, store: MemoryStore, entry: MemoryEntry, *,
                 tools: ToolCatalog | None = None) -> MemoryEntry:
    """Verify a candidate ``entry`` on ``engine`` (with ``tools``, the engine's by default) and admit or reject it.

    Returns the entry as stored afterwards; a lesson without a check comes back unchanged (still a candidate).
    """
    if entry.status != "candidate":
        raise MemoryStoreError(f"memory entry {entry.id} is {entry.status}: only a candidate is verified")
    plan = verification_plan(entry)
    if plan is None:
        return entry
    what = "replay" if entry.kind == "skill" else "check"
    try:
        run = await engine.start(plan, tools=tools, source=REPLAY_SOURCE)
        result = await run.wait()
    except PlanweaveError as exc:  # an invalid sub-plan or check: it cannot be verified, so it is not admitted
        return await store.set_status(entry.id, "rejected", f"{what} could not start: {exc}")
    if result.ok:
        return await store.set_status(entry.id, "admitted", f"{what} run {result.run_id} succeeded")
    return await store.set_status(entry.id, "rejected", f"{what} run {result.run_id} {result.status}: "
                                                         f"{result.error}")


async def verify_all(engine: Engine, store: MemoryStore, entries: Sequence[MemoryEntry], *,
                     tools: ToolCatalog | None = None) -> list[MemoryEntry]:
    """:func:`verify` each entry in turn (replays share the engine; one at a time keeps their runs apart)."""
    return [await verify(engine, store, entry, tools=tools) for entry in entries]


async def admit_by_person(store: MemoryStore, entry_id: int, who: str = "a person") -> MemoryEntry:
    """Admit a lesson that has no check step on a person's word; anything else is refused, naming why."""
    entry = await store.get(entry_id)
    if entry.status != "candidate":
        raise MemoryStoreError(f"memory entry {entry_id} is {entry.status}: only a candidate can be admitted")
    if entry.kind == "skill":
        raise MemoryStoreError(f"memory entry {entry_id} is a skill: a skill is admitted only by replaying it "
                               "(planweave memory verify)")
    if entry.check is not None:
        raise MemoryStoreError(f"memory entry {entry_id} carries a check step: it is admitted only when the check "
                               "succeeds (planweave memory verify)")
    return await store.set_status(entry_id, "admitted", f"approved by {who}")
