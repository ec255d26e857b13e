"""``GET /memory`` and ``GET /memory/{id}``: the lessons and skills kept across runs, as the dashboard shows them.

The store is the journal's own (:func:`~planweave.memory.open_memory_store`), opened from the URL the server was
started with: a PostgreSQL journal reports its URL without the password, which could not connect. It is opened at
the first request and closed when the server stops. Without the ``memory`` extra the endpoints answer 501, naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, cast

from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.extras import require

if TYPE_CHECKING:
    from planweave.memory import EntryStatus, MemoryStore

__all__ = ["MemoryAccess"]

_STATUSES = ("candidate", "admitted", "rejected", "retired")


class MemoryAccess:
    """The memory store of one server's journal, opened once on first use."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._stack: contextlib.AsyncExitStack | None = None
        self._store: MemoryStore | None = None
        self._lock = asyncio.Lock()

    async def store(self) -> MemoryStore:
        """The store; raises :class:`~planweave.extras.MissingExtra` without the ``memory`` extra."""
        require("memory", "GET /memory")
        async with self._lock:
            if self._store is None:
                from planweave.memory import open_memory_store

                stack = contextlib.AsyncExitStack()
                self._store = await stack.enter_async_context(open_memory_store(self.url))
                self._stack = stack
            return self._store

    async def entries(self, status: str | None) -> list[dict[str, Any]]:
        """Every entry (oldest first) as ``planweave memory list --json`` prints it, optionally of one status."""
        if status is not None and status not in _STATUSES:
            raise PlanInvalid([PlanProblem("", "query.status", f"status '{status}': use one of "
                                                               f"{', '.join(_STATUSES)}")], "GET /memory")
        store = await self.store()
        return [e.to_json() for e in await store.entries(status=cast("EntryStatus | None", status))]

    async def entry(self, entry_id: int) -> dict[str, Any]:
        """One entry as ``planweave memory show --json`` prints it; raises UnknownEntry for an unknown id."""
        store = await self.store()
        if not 0 < entry_id < 2**63:  # beyond a database integer: no such entry (not an overflow)
            from planweave.memory.model import unknown

            raise unknown(entry_id, self.url)
        return (await store.get(entry_id)).to_json()

    async def close(self) -> None:
        async with self._lock:
            stack, self._stack, self._store = self._stack, None, None
        if stack is not None:
            await stack.aclose()
