"""Shared helpers for engine tests: a recording toolbox and a virtual-clock runner."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from planweave import Event, RunResult, Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.core.state import RunState
from planweave.journal import Journal, open_journal
from planweave.journal.base import CachedOutput
from planweave.journal.memory import MemoryJournal
from planweave.journal.summary import ALL_RUNS, PRUNE_DEFAULT, PruneResult, RunPage, RunQuery
from tests.journal.conftest import _make as make_backend  # the conformance suite's backends, one storage each

T = TypeVar("T")


@dataclass
class Recorder:
    """Tools that record when each call started and ended (on the engine's clock).

    ``starts`` and ``successes`` keep every call, so a test can see work that ran twice; ``ends`` is the time of the
    latest success, for tests that only need one figure per step.
    """

    starts: dict[str, list[float]] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)
    successes: dict[str, list[float]] = field(default_factory=dict)
    running: int = 0
    peak: int = 0
    calls: list[str] = field(default_factory=list)

    def toolbox(self) -> Toolbox:
        box = builtin_tools()
        rec = self

        async def work(name: str, seconds: float = 0.0, fail_times: int = 0, result: Any = None) -> Any:
            """Sleep `seconds`, failing the first `fail_times` attempts."""
            loop = asyncio.get_running_loop()
            rec.starts.setdefault(name, []).append(loop.time())
            rec.calls.append(name)
            rec.running += 1
            rec.peak = max(rec.peak, rec.running)
            try:
                await asyncio.sleep(seconds)
                if len(rec.starts[name]) <= fail_times:
                    raise ConnectionError(f"{name} flaked")
            finally:
                rec.running -= 1
            rec.ends[name] = loop.time()
            rec.successes.setdefault(name, []).append(rec.ends[name])
            return {"name": name} if result is None else result

        box.add(work, idempotent=True)
        return box


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


class JournalInAThread:
    """A journal served by its own real-time event loop in a daemon thread, each call waited for in a thread.

    The virtual clock waits for work in threads but not for sockets (see :mod:`planweave.core.clock`): on it, time would
    run ahead while PostgreSQL answers (a 2 s sleep ends before a write-ahead flush is back). Hosting the journal on
    a loop of its own and waiting for it through ``run_in_executor`` keeps every engine test exact on PostgreSQL too.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, inner: Journal) -> None:
        self._loop = loop
        self._thread = thread
        self._inner = inner
        self.url = inner.url
        self.durable = inner.durable

    @classmethod
    async def open(cls, url: str) -> JournalInAThread:
        """Open the journal at ``url`` on a new loop in a new thread."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True, name="journal-loop")
        thread.start()

        async def opened() -> Journal:
            from planweave.journal.postgres import PostgresJournal

            return await PostgresJournal.open(url)

        return cls(loop, thread, await cls._wait(loop, opened()))

    @staticmethod
    async def _wait(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        return await asyncio.get_running_loop().run_in_executor(None, future.result)

    def _now(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def append(self, event: Event) -> None:
        self._now(lambda: self._inner.append(event))

    def put_blob(self, value: Any) -> str:
        return self._now(lambda: self._inner.put_blob(value))

    async def flush(self) -> None:
        await self._wait(self._loop, self._inner.flush())

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        return await self._wait(self._loop, self._inner.read(run_id, after, kind, limit))

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return await self._wait(self._loop, self._inner.get_blobs(list(refs)))

    async def run_ids(self) -> list[str]:
        return await self._wait(self._loop, self._inner.run_ids())

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        pass  # the state lives on this loop, the writer on the other: summaries are folded on listing instead

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        return await self._wait(self._loop, self._inner.list_runs(query))

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        return await self._wait(self._loop, self._inner.prune(finished_before, statuses))

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        return await self._wait(self._loop, self._inner.find_cached(key, since))

    async def close(self) -> None:
        try:
            await self._wait(self._loop, self._inner.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._loop.close()


@dataclass
class JournalAt:
    """One journal's storage, which each engine opens afresh (as a restarted process would); memory keeps one."""

    url: str
    _memory: MemoryJournal | None = None

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Journal]:
        """The journal, open for the block; the memory journal is the same object every time."""
        if self._memory is not None:
            yield self._memory
            return
        if self.url.startswith("postgresql://"):
            threaded = await JournalInAThread.open(self.url)
            try:
                yield threaded
            finally:
                await threaded.close()
            return
        async with open_journal(self.url) as journal:
            yield journal

    def events(self, run_id: str | None = None) -> list[Event]:
        """Every event stored (of one run), read back over a new connection."""

        async def read() -> list[Event]:
            async with self.open() as journal:
                return await journal.read(run_id)

        return run_virtual(read())


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_at(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JournalAt]:
    """Every journal implementation (memory, SQLite, PostgreSQL), on empty storage: engine tests run on each."""
    for backend in make_backend(request.param, tmp_path):
        yield JournalAt(backend.url, MemoryJournal() if backend.name == "memory" else None)
    gc.collect()  # what a test leaves unfinished is reported in that test, not in whichever test collects it


def virtual(fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async function on the virtual clock."""

    async def main() -> T:
        return await fn()

    return run_virtual(main())


def run_plan(
    doc: Mapping[str, Any],
    tools: Toolbox | None = None,
    *,
    concurrency: int | None = None,
    capacities: Mapping[str, int] | None = None,
    run_id: str | None = None,
    journal: JournalAt | None = None,
) -> RunResult:
    """Run one plan to completion on the virtual clock, with an in-memory journal unless ``journal`` is given."""

    async def go() -> RunResult:
        async with (journal or JournalAt("memory://", MemoryJournal())).open() as opened, open_engine(
            opened, clock=VirtualClock(), concurrency=concurrency, capacities=capacities, tools=tools
        ) as engine:
            run = await engine.start(doc, run_id=run_id)
            return await run.wait()

    return virtual(go)
