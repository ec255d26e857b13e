"""Event streams hold one page of the journal per client, not the journal: slow and non-reading clients cost a
page each, a reading client still gets every event in order exactly once, and a stream that falls too far behind
the live events ends with a message naming where to read on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from planweave import Engine, Event, open_journal
from planweave.journal import Journal
from planweave.server import LiveServer, StreamLimits, StreamTiming, create_app

from .conftest import TOKEN, Live, RunTracker, chain_plan, sse

PAD = "x" * 2000  # ~2 KB an event: the journal below is ~10 MB of SSE, more than socket buffers hold
TIMING = StreamTiming(ping_interval=5.0, follow_interval=0.05)


@dataclass
class Page:
    stream: int  # the task reading it: one per client's stream
    run_id: str | None
    limit: int | None
    events: int


@dataclass
class PagedJournal:
    """A journal that records every read the server's streams make (the engine's own reads are left out)."""

    inner: Journal
    pages: list[Page] = field(default_factory=list)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)  # a stream read less than a full page

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        found = await self.inner.read(run_id, after, kind, limit)
        task = asyncio.current_task()
        if task is not None and task.get_name() != "planweave-control" and kind is None:
            self.pages.append(Page(id(task), run_id, limit, len(found)))
            if limit is None or len(found) < limit:
                self.caught_up.set()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def paged_server(journal_url: str, limits: StreamLimits) -> AsyncIterator[tuple[Live, PagedJournal]]:
    async with open_journal(journal_url) as inner:
        journal = PagedJournal(inner)
        async with Engine(journal) as engine:  # a Journal: read here, the rest by delegation
            tracker = RunTracker(engine)
            app = create_app(engine, TOKEN, recover=False, timing=TIMING, stream_limits=limits)
            async with LiveServer(app, "127.0.0.1", 0, log_config=None) as server:
                yield Live(server, engine, journal_url, TOKEN, tracker), journal


def positions(events: list[Event]) -> list[int]:
    return [e.pos or 0 for e in events]


def fill(journal: Journal, n: int, run_id: str = "bulk", first: int = 0) -> None:
    for i in range(first, first + n):
        journal.append(Event(run_id, "step_started", 1.0 + i, f"s{i}", {"attempt": 1, "pad": PAD, "i": i}))


async def silent_client(url: str, path: str) -> socket.socket:
    """A client that asks for ``path`` and then never reads: a receive buffer as small as the system allows."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  "Accept: text/event-stream\r\n\r\n".encode())
    return sock


async def read_events(client: httpx.AsyncClient, path: str, last: int, after: int = 0) -> list[dict[str, Any]]:
    """Frames of ``path`` after ``after`` up to the event at position ``last`` (or a ``lagging`` frame)."""
    frames: list[dict[str, Any]] = []
    headers = {"Last-Event-ID": str(after)} if after else {}
    async with client.stream("GET", path, headers=headers) as resp:
        assert resp.status_code == 200
        async for frame in sse(resp):
            frames.append(frame)
            if frame["event"] == "lagging" or int(frame.get("id", 0)) >= last:
                break
    return frames


async def test_slow_clients_hold_a_page_each_and_a_reading_client_gets_every_event_once(journal_url: str) -> None:
    limits = StreamLimits(page_size=64, max_lag=10_000)
    async with paged_server(journal_url, limits) as (live, journal):
        fill(live.engine.journal, 5000)
        await live.engine.journal.flush()
        stored = positions(await journal.inner.read())
        silent = [await silent_client(live.url, "/events") for _ in range(4)]
        try:
            async with live.client() as client:
                run_id = (await client.post("/runs", json={"plan": chain_plan(120, 0)})).json()["run_id"]
                await live.wait(run_id)
                run_events = positions(await journal.inner.read(run_id))
                of_run = await read_events(client, f"/runs/{run_id}/events", run_events[-1])
                every = await read_events(client, "/events", max(run_events[-1], stored[-1]))
            pages = list(journal.pages)
        finally:
            for sock in silent:
                sock.close()
    assert [int(f["id"]) for f in of_run] == run_events  # in order, each once
    assert [int(f["id"]) for f in every] == sorted(stored + run_events)
    assert pages and [p for p in pages if p.limit is None or p.events > limits.page_size] == []  # one page held
    # The silent clients' streams stopped reading once their connection's buffers were full: far from the journal.
    by_stream: dict[int, int] = {}
    for p in pages:
        if p.run_id is None:
            by_stream[p.stream] = by_stream.get(p.stream, 0) + p.events
    silent_reads = sorted(by_stream.values())[:4]  # the reading client's stream read everything
    assert len(by_stream) == 5 and max(silent_reads) < len(stored) // 2, silent_reads


async def test_a_stream_that_falls_behind_the_live_events_ends_naming_where_to_read_on(journal_url: str) -> None:
    limits = StreamLimits(page_size=8, max_lag=32)
    async with paged_server(journal_url, limits) as (live, journal), live.client() as client:
        fill(live.engine.journal, 20)  # a replay of any length is not lagging
        await live.engine.journal.flush()
        journal.caught_up.clear()
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(30), client.stream("GET", "/events") as resp:  # no lagging: fail, not hang
            stream = sse(resp)
            while len(frames) < 20:
                frames.append(await anext(stream))
            await asyncio.wait_for(journal.caught_up.wait(), 10)  # the stream read a short page: it is live now
            fill(live.engine.journal, 100, first=20)  # a burst it cannot keep up with
            async for frame in stream:
                frames.append(frame)
                if frame["event"] == "lagging":
                    break
        lagging = frames[-1]
        assert lagging["event"] == "lagging"
        assert 20 + 32 < len(frames) - 1 < 120  # ended past max_lag live events, not after all of them
        after = lagging["data"]["after"]
        assert after == int(frames[-2]["id"]) and f"Last-Event-ID: {after}" in lagging["data"]["message"]
        stored = positions(await journal.inner.read())
        rest = await read_events(client, "/events", stored[-1], after=after)
    assert [int(f["id"]) for f in frames[:-1] + rest] == stored  # nothing lost or repeated across the reconnect
