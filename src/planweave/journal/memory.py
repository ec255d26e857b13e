"""An in-memory journal: the same contract as the durable ones, for runs that need no durability."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from planweave.engine.events import Event
from planweave.journal.base import decode_blob, encode_blob, encode_event


class MemoryJournal:
    """Keeps events (with their data encoded, as a durable journal stores it) and blobs in this process.

    Events are encoded on ``append`` (data that cannot be stored is refused with EventNotRecorded, as by every
    journal) and decoded on ``read``, so readers see exactly what they would read from SQLite or PostgreSQL.
    """

    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._events: list[tuple[Event, bytes]] = []
        self._blobs: dict[str, bytes] = {}
        self._runs: dict[str, None] = {}

    def append(self, event: Event) -> None:
        # The event is kept as given (its pos is its index + 1, set on read): no copy on the engine's hot path.
        self._events.append((event, encode_event(event, self.url)))
        self._runs.setdefault(event.run_id)

    def put_blob(self, value: Any) -> str:
        ref, data = encode_blob(value)
        self._blobs.setdefault(ref, data)
        return ref

    async def flush(self) -> None:
        pass

    async def read(self, run_id: str | None = None, after: int = 0, kind: str | None = None) -> list[Event]:
        return [Event(e.run_id, e.kind, e.at, e.step, decode_blob(data), pos)
                for pos, (e, data) in enumerate(self._events[after:], after + 1)
                if (run_id is None or e.run_id == run_id) and (kind is None or e.kind == kind)]

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return {r: decode_blob(self._blobs[r]) for r in refs if r in self._blobs}

    async def run_ids(self) -> list[str]:
        return list(self._runs)

    async def close(self) -> None:
        pass
