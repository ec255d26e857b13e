"""Event streams: journal positions as ids, resuming after Last-Event-ID with nothing lost or repeated, wake-ups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from planweave import Engine, Event, open_engine, open_journal
from planweave.core.state import RunState
from planweave.journal import Journal
from planweave.journal.base import CachedOutput
from planweave.journal.summary import ALL_RUNS, PRUNE_DEFAULT, PruneResult, RunPage, RunQuery
from planweave.server import LiveServer, StreamTiming, create_app

from .conftest import TOKEN, Live, chain_plan, sse, start_live


async def submit(client: httpx.AsyncClient, plan: dict[str, Any]) -> str:
    resp = await client.post("/runs", json={"plan": plan})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


async def read_stream(client: httpx.AsyncClient, path: str, last_id: int | None = None,
                      limit: int | None = None, until: Any = None) -> list[dict[str, Any]]:
    """Read events from ``path`` after ``last_id``: all of them, ``limit`` of them, or up to ``until(frame)``."""
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    frames: list[dict[str, Any]] = []
    async with client.stream("GET", path, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for frame in sse(resp):
            frames.append(frame)
            done = until is not None and until(frame)
            if done or (limit is not None and len(frames) >= limit):
                break
    return frames


def as_journal(frames: Iterable[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    return [(int(f["id"]), f["event"], f["data"]["step"]) for f in frames]


def journaled(events: Iterable[Event]) -> list[tuple[int, str, str | None]]:
    return [(e.pos or 0, e.kind, e.step) for e in events]


async def test_events_carry_their_journal_position_and_the_stream_ends_after_run_finished(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, chain_plan(3, 0.02))
        frames = await read_stream(client, f"/runs/{run_id}/events")
    events = await live.journal_events(run_id)
    assert as_journal(frames) == journaled(events)
    assert frames[0]["event"] == "run_created" and frames[-1]["event"] == "run_finished"
    for frame, event in zip(frames, events, strict=True):
        assert frame["data"]["pos"] == event.pos and frame["data"]["kind"] == event.kind
        assert frame["data"]["run_id"] == run_id


async def test_reconnecting_with_last_event_id_loses_nothing_and_repeats_nothing(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, chain_plan(6, 0.05))
        received: list[dict[str, Any]] = []
        last: int | None = None
        while not received or received[-1]["event"] != "run_finished":
            # A few events per connection, then hang up, as a flaky network would.
            part = await read_stream(client, f"/runs/{run_id}/events", last, limit=3)
            assert part, "a reconnect before the run finished must get the events that happened meanwhile"
            received += part
            last = int(part[-1]["id"])
    ids = [int(f["id"]) for f in received]
    assert len(ids) == len(set(ids))  # nothing twice
    assert as_journal(received) == journaled(await live.journal_events(run_id))  # nothing lost
    assert len(received) == 1 + 2 * 6 + 1


async def test_the_global_stream_resumes_from_the_runs_list_position(live: Live) -> None:
    async with live.client() as client:
        first = await submit(client, chain_plan(1, 0.0))
        await live.wait(first)
        listed = await client.get("/runs")
        start = int(listed.headers["x-journal-position"])
        runs = [await submit(client, chain_plan(3, 0.03, prefix=p)) for p in ("x", "y")]
        finished: set[str] = set()

        def both_done(frame: dict[str, Any]) -> bool:
            if frame["event"] == "run_finished":
                finished.add(frame["data"]["run_id"])
            return finished == set(runs)

        received: list[dict[str, Any]] = []
        last = start
        while finished != set(runs):
            part = await read_stream(client, "/events", last, limit=4, until=both_done)
            received += part
            last = int(part[-1]["id"])
    assert as_journal(received) == journaled(await live.journal_events(None, after=start))
    assert {f["data"]["run_id"] for f in received} == set(runs)


async def test_a_finished_run_is_replayed_from_the_journal(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, chain_plan(2, 0.0))
        await live.wait(run_id)
        frames = await read_stream(client, f"/runs/{run_id}/events")
        tail = await read_stream(client, f"/runs/{run_id}/events", int(frames[1]["id"]))
    assert as_journal(frames) == journaled(await live.journal_events(run_id))
    assert tail == frames[2:]


async def test_a_bad_last_event_id_is_rejected(live: Live) -> None:
    async with live.client() as client:
        resp = await client.get("/events", headers={"Last-Event-ID": "yesterday"})
    assert resp.status_code == 422
    assert resp.json()["problems"][0]["field"] == "header.Last-Event-ID"


class CountingJournal:
    """A journal that counts the reads of each run's events (to tell waking up from polling)."""

    def __init__(self, inner: Journal) -> None:
        self.inner = inner
        self.durable = inner.durable
        self.url = inner.url
        self.reads: dict[str | None, int] = {}

    def append(self, event: Event) -> None:
        self.inner.append(event)

    def put_blob(self, value: Any) -> str:
        return self.inner.put_blob(value)

    async def flush(self) -> None:
        await self.inner.flush()

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        task = asyncio.current_task()
        if task is None or task.get_name() != "planweave-control":  # the engine's own cancel watcher reads too
            self.reads[run_id] = self.reads.get(run_id, 0) + 1
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


@asynccontextmanager
async def counting_server(journal_url: str, timing: StreamTiming) -> AsyncIterator[tuple[Live, CountingJournal]]:
    async with open_journal(journal_url) as inner:
        journal = CountingJournal(inner)
        async with Engine(journal) as engine:
            app = create_app(engine, TOKEN, timing=timing)
            async with LiveServer(app, "127.0.0.1", 0, log_config=None) as server:
                yield Live(server, engine, journal_url), journal


async def test_a_run_active_here_is_streamed_on_engine_notifications_not_by_polling(journal_url: str) -> None:
    # If the stream polled the journal, a 1 s step with a 0.05 s interval would mean some 20 reads of the run.
    timing = StreamTiming(ping_interval=0.2, follow_interval=0.05)
    async with counting_server(journal_url, timing) as (live, journal), live.client() as client:
        run_id = await submit(client, {"steps": [{"id": "slow", "tool": "sleep", "args": {"seconds": 1.0}}]})
        lines: list[str] = []
        async with client.stream("GET", f"/runs/{run_id}/events") as resp:
            async for line in resp.aiter_lines():
                lines.append(line)
        events = await live.journal_events(run_id)
    reads = journal.reads.get(run_id, 0) - 1  # minus the read above
    assert [line.split(": ")[1] for line in lines if line.startswith("event: ")] == [e.kind for e in events]
    assert reads <= len(events) + 1, f"{reads} reads of the journal for {len(events)} events"
    assert ": ping" in lines  # the idle connection was kept alive without reading the journal


async def test_a_run_of_another_process_is_followed_through_the_journal(live: Live) -> None:
    # Another engine on the same journal file stands for another process: this server only sees the journal.
    async with open_engine(live.journal_url) as other:
        run = await other.start(chain_plan(3, 0.05), run_id="elsewhere")
        async with live.client() as client:
            frames = await read_stream(client, "/runs/elsewhere/events")
            await run.wait()
            listed = (await client.get("/runs")).json()
        events = await live.journal_events("elsewhere")
    assert as_journal(frames) == journaled(events)
    assert [row["run_id"] for row in listed] == ["elsewhere"]


async def test_streams_end_when_the_server_stops(journal_url: str) -> None:
    async with start_live(journal_url) as live, live.client() as client:
        run_id = await submit(client, {"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 60}}]})
        connected = {"run": asyncio.Event(), "all": asyncio.Event()}

        async def follow(name: str, path: str) -> list[dict[str, Any]]:
            frames = []
            async with live.client() as own, own.stream("GET", path) as resp:
                async for frame in sse(resp):
                    frames.append(frame)
                    connected[name].set()
            return frames

        streams = asyncio.gather(follow("run", f"/runs/{run_id}/events"), follow("all", "/events"))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in connected.values())), 10)
        live.server.stop()
        run_frames, all_frames = await asyncio.wait_for(streams, 10)  # ended by the server, not hanging
    assert [f["event"] for f in run_frames] == ["run_created", "step_started"]
    assert [f["event"] for f in all_frames] == ["run_created", "step_started"]
