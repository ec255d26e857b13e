"""An in-memory journal: the same contract as the durable ones, for runs that need no durability."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from planweave.core.events import Event
from planweave.core.replies import reply_events, standing_reply
from planweave.journal.base import (
    CachedOutput,
    ReplyWritten,
    cache_entries,
    decode_blob,
    encode_blob,
    encode_event,
)
from planweave.journal.summary import (
    ALL_RUNS,
    PRUNE_DEFAULT,
    PruneResult,
    RunPage,
    RunQuery,
    RunSummary,
    check_prunable,
    fold_summary,
    run_level,
    select_page,
    summarise,
)

if TYPE_CHECKING:
    from planweave.core.state import RunState


class MemoryJournal:
    """Keeps events (with their data encoded, as a durable journal stores it) and blobs in this process.

    Events are encoded on ``append`` (data that cannot be stored is refused with EventNotRecorded, as by every
    journal) and decoded on ``read``, so readers see exactly what they would read from SQLite or PostgreSQL.
    """

    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        # A pruned event leaves None in its place: positions never move.
        self._events: list[tuple[Event, bytes] | None] = []
        self._blobs: dict[str, bytes] = {}
        self._by_run: dict[str, list[int]] = {}  # run -> indices of its events, in order
        # run -> (its live state, events it had applied when tracked, events of the run in the journal then, what
        # hides secrets in its texts)
        self._tracked: dict[str, tuple[RunState, int, int, Callable[[Any], Any] | None]] = {}
        self._folded: dict[str, tuple[int, RunSummary]] = {}  # run -> (events folded, summary): untracked runs
        self._cache: dict[str, list[CachedOutput]] = {}  # cache key -> the outputs indexed under it, oldest first

    def append(self, event: Event) -> None:
        # The event is kept as given (its pos is its index + 1, set on read): no copy on the engine's hot path.
        # A copy of exactly its size: orjson's result keeps its 4 KiB working buffer, and this journal keeps every
        # event for good (10,000 runs of 5 steps: 500 MiB of buffers; bench scale).
        data = bytes(memoryview(encode_event(event, self.url)))
        index = len(self._events)
        self._events.append((event, data))
        mine = self._by_run.get(event.run_id)
        if mine is None:
            self._by_run[event.run_id] = [index]
        else:
            mine.append(index)
        if event.kind == "step_succeeded" and "cache_key" in event.data:
            for key, entry in cache_entries([(event, data)]):
                self._cache.setdefault(key, []).append(entry)

    def put_blob(self, value: Any) -> str:
        ref, data = encode_blob(value)
        if ref not in self._blobs:
            self._blobs[ref] = bytes(memoryview(data))  # exactly its size, as for events
        return ref

    async def flush(self) -> None:
        pass

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        indices: Iterable[int]
        if run_id is not None:
            mine = self._by_run.get(run_id, [])
            indices = itertools.islice(mine, bisect.bisect_left(mine, after), None)  # a page costs the page
        else:
            indices = range(max(after, 0), len(self._events))
        found = ((i, item) for i in indices if (item := self._events[i]) is not None
                 and (kind is None or item[0].kind == kind))
        return [Event(e.run_id, e.kind, e.at, e.step, decode_blob(data), i + 1)
                for i, (e, data) in itertools.islice(found, limit)]

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return {r: decode_blob(self._blobs[r]) for r in refs if r in self._blobs}

    async def run_ids(self) -> list[str]:
        return list(self._by_run)

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        self._tracked[run_id] = (state, state.events_applied, len(self._by_run.get(run_id, ())), redact)

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        return select_page([self._summary(run_id) for run_id in reversed(self._by_run)], query, len(self._events))

    def _summary(self, run_id: str) -> RunSummary:
        indices = self._by_run[run_id]
        seq = indices[0] + 1
        tracked = self._tracked.get(run_id)
        if tracked is not None:
            state, applied, known, redact = tracked
            # Live only while every event of the run since tracking went through the state (the engine appends,
            # then applies); another writer's event (a cancel from outside the engine) means folding instead.
            if state.events_applied - applied == len(indices) - known:
                events = [item[0] for i in indices if (item := self._events[i]) is not None]
                return summarise(state, updated_at=events[-1].at, seq=seq, redact=redact, **_owner_source(events))
            del self._tracked[run_id]
        cached = self._folded.get(run_id)
        if cached is not None and cached[0] == len(indices):
            return cached[1]
        summary = fold_summary(run_id, [item[0] for i in indices if (item := self._events[i]) is not None], seq)
        self._folded[run_id] = (len(indices), summary)
        return summary

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        wanted = check_prunable(statuses)
        doomed = [s for s in map(self._summary, list(self._by_run)) if s.status in wanted
                  and s.finished_at is not None and s.finished_at < finished_before]
        events = freed = 0
        refs: set[str] = set()
        for summary in doomed:
            for i in self._by_run.pop(summary.run_id):
                item = self._events[i]
                if item is not None:
                    events += 1
                    freed += len(item[1])
                    if item[0].kind == "step_succeeded" and isinstance(item[0].data.get("output"), str):
                        refs.add(item[0].data["output"])
                    self._events[i] = None
            self._tracked.pop(summary.run_id, None)
            self._folded.pop(summary.run_id, None)
        gone = {s.run_id for s in doomed}
        for key, entries in list(self._cache.items()):
            left = [e for e in entries if e.run_id not in gone]
            if left:
                self._cache[key] = left
            else:
                del self._cache[key]
        kept = {item[0].data.get("output") for item in self._events
                if item is not None and item[0].kind == "step_succeeded"}
        outputs = 0
        for ref in refs - kept:
            data = self._blobs.pop(ref, None)
            if data is not None:
                outputs += 1
                freed += len(data)
        return PruneResult([s.run_id for s in doomed], events, outputs, freed)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        usable = [e for e in self._cache.get(key, ()) if e.at >= since and e.output in self._blobs]
        if not usable:
            return None
        newest = max(reversed(usable), key=lambda e: e.at)  # the last written among equals
        value = decode_blob(self._blobs[newest.output])
        return CachedOutput(newest.run_id, newest.step, newest.at, newest.output, value)

    async def append_reply(self, event: Event) -> ReplyWritten:
        # One process, and its reads never suspend: nothing can write between the check and the append.
        standing = standing_reply(reply_events(await self.read(event.run_id), event.step))
        if standing is not None:
            return ReplyWritten(False, standing)
        self.append(event)
        return ReplyWritten(True, (await self.read(event.run_id, after=len(self._events) - 1))[0])

    async def close(self) -> None:
        pass


def _owner_source(events: list[Event]) -> dict[str, Any]:
    owner, source = run_level(events)
    return {"owner": owner, "source": source or ""}
