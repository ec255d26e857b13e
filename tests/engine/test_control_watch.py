"""The engine's control watcher (replies and cancels written by other processes) reads per turn what was written,
not once per active run: 200 waiting runs cost the same reads as one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from planweave import Engine, Event, builtin_tools, send_approval
from planweave.core.state import RunState
from planweave.journal import Journal, open_journal
from planweave.journal.base import CachedOutput
from planweave.journal.summary import ALL_RUNS, PRUNE_DEFAULT, PruneResult, RunPage, RunQuery

RUNS = 200


class ReadLog:
    """A journal that logs each read as (run id, kind) and says when the all-runs reads of two turns are done."""

    def __init__(self, inner: Journal) -> None:
        self.inner, self.url, self.durable = inner, inner.url, inner.durable
        self.reads: list[tuple[str | None, str | None]] = []
        self.turns = asyncio.Event()
        self.watching = False

    def append(self, event: Event) -> None:
        self.inner.append(event)

    def put_blob(self, value: Any) -> str:
        return self.inner.put_blob(value)

    async def flush(self) -> None:
        await self.inner.flush()

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        if self.watching and kind is not None:
            self.reads.append((run_id, kind))
            if sum(1 for r, _ in self.reads if r is None) >= 4:  # two kinds a turn: two turns
                self.turns.set()
        return await self.inner.read(run_id, after, kind, limit)

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return await self.inner.get_blobs(refs)

    async def run_ids(self) -> list[str]:
        return await self.inner.run_ids()

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        self.inner.track(run_id, state, redact)

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        return await self.inner.list_runs(query)

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        return await self.inner.prune(finished_before, statuses)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        return await self.inner.find_cached(key, since)

    async def close(self) -> None:
        await self.inner.close()


async def test_the_control_watcher_reads_once_per_kind_per_turn_however_many_runs(tmp_path: Path) -> None:
    async with open_journal(f"sqlite:///{tmp_path / 'runs.db'}") as inner:
        journal = ReadLog(inner)
        async with Engine(journal, tools=builtin_tools()) as engine:
            runs = [await engine.start({"steps": [{"id": "gate", "tool": "noop", "approval": True}]}, run_id=f"r{i}")
                    for i in range(RUNS)]
            journal.watching = True
            assert await send_approval(journal, "r7", "gate", approve=True) == "applied"
            async with asyncio.timeout(20):
                await journal.turns.wait()
                result = await runs[7].wait()  # the reply reached it through the all-runs read
            for run in runs:
                run.cancel("done")
    per_run = [r for r in journal.reads if r[0] is not None]
    assert per_run == [], f"{len(per_run)} reads of single runs"
    assert result.ok and result.state.records["gate"].status == "succeeded"
