"""The ``MemoryStore`` protocol, the in-process store, and :func:`open_memory_store` for a journal URL.

A store keeps entries in the journal's own database (SQLite file or PostgreSQL schema) in tables of its own, with
their own schema version, so the journal's tables and migrations are untouched. Every backend passes one
conformance suite (``tests/memory/test_store_conformance.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Protocol

from planweave.memory.model import (
    Candidate,
    EntryKind,
    EntryStatus,
    MemoryEntry,
    MemoryStoreError,
    checked,
    unknown,
)

__all__ = ["InMemoryStore", "MemoryStore", "open_memory_store"]


class MemoryStore(Protocol):
    """Lessons and skills across runs: add candidates, read them back, move them through their statuses.

    ``add`` gives a candidate the next version of its kind and name (1 for a new name) and the status
    ``candidate``. ``set_status(id, "admitted")`` retires the other admitted versions of the same kind and name
    (the newer one supersedes them). Unknown ids raise :class:`UnknownEntry`.
    """

    url: str

    async def add(self, candidate: Candidate) -> MemoryEntry: ...

    async def get(self, entry_id: int) -> MemoryEntry: ...

    async def entries(self, *, status: EntryStatus | None = None, kind: EntryKind | None = None) -> list[MemoryEntry]:
        """Entries oldest first, optionally only those of one status and kind."""
        ...

    async def set_status(self, entry_id: int, status: EntryStatus, note: str = "") -> MemoryEntry: ...

    async def record_use(self, entry_ids: Sequence[int]) -> None:
        """Add one to the use count of each entry (those retrieved into a planner prompt)."""
        ...

    async def close(self) -> None: ...


class InMemoryStore:
    """A store in this process only (``memory://`` journals and tests)."""

    def __init__(self, url: str = "memory://", *, now: Callable[[], float] = time.time) -> None:
        self.url = url
        self._now = now
        self._entries: dict[int, MemoryEntry] = {}

    async def add(self, candidate: Candidate) -> MemoryEntry:
        checked(candidate)
        version = 1 + max((e.version for e in self._entries.values()
                           if e.kind == candidate.kind and e.name == candidate.name), default=0)
        entry = MemoryEntry(len(self._entries) + 1, candidate.kind, candidate.name, candidate.text, version,
                            "candidate", 0, self._now(), tuple(candidate.steps), dict(candidate.params),
                            candidate.check, candidate.run_id, tuple(candidate.step_ids),
                            hosts=tuple(candidate.hosts))
        self._entries[entry.id] = entry
        return entry

    async def get(self, entry_id: int) -> MemoryEntry:
        if entry_id not in self._entries:
            raise unknown(entry_id, self.url)
        return self._entries[entry_id]

    async def entries(self, *, status: EntryStatus | None = None, kind: EntryKind | None = None) -> list[MemoryEntry]:
        return [e for e in self._entries.values()
                if (status is None or e.status == status) and (kind is None or e.kind == kind)]

    async def set_status(self, entry_id: int, status: EntryStatus, note: str = "") -> MemoryEntry:
        entry = await self.get(entry_id)
        if status == "admitted":
            for other in list(self._entries.values()):
                if (other.id != entry_id and other.status == "admitted" and other.kind == entry.kind
                        and other.name == entry.name):
                    self._entries[other.id] = other.with_status("retired", f"superseded by entry {entry_id}")
        self._entries[entry_id] = entry = entry.with_status(status, note)
        return entry

    async def record_use(self, entry_ids: Sequence[int]) -> None:
        for entry_id in dict.fromkeys(entry_ids):  # an id listed twice is one use
            entry = await self.get(entry_id)
            self._entries[entry_id] = replace(entry, uses=entry.uses + 1)

    async def close(self) -> None:
        return None


@asynccontextmanager
async def open_memory_store(url: str, *, now: Callable[[], float] = time.time) -> AsyncIterator[MemoryStore]:
    """The memory store in the database of the journal at ``url`` (``memory://``, ``sqlite:///...``,
    ``postgresql://...``), its tables created if missing; closed on exit."""
    store: MemoryStore
    if url.startswith("memory://"):
        store = InMemoryStore(url, now=now)
    elif url.startswith("sqlite://"):
        from planweave.memory.sqlite import SQLiteMemoryStore

        store = await SQLiteMemoryStore.open(url, now=now)
    elif url.startswith(("postgresql://", "postgres://")):
        from planweave.extras import require

        require("postgres", "a PostgreSQL memory store")
        from planweave.memory.postgres import PostgresMemoryStore

        store = await PostgresMemoryStore.open(url, now=now)
    else:
        raise MemoryStoreError(f"memory store URL '{url}' is not understood: use the journal's URL "
                               "(memory://, sqlite:///path.db or postgresql://host/db)")
    try:
        yield store
    finally:
        await store.close()
