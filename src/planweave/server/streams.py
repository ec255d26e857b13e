"""Server-sent event streams of journaled events, resumable by journal position and live by notification.

Every event goes out as ``id: <journal pos>``, ``event: <kind>``, ``data: <event JSON>``. A stream first replays
the journal after the client's ``Last-Event-ID``, then waits. While the run is active in this process it waits for
the engine's listener to say that something happened (:class:`ChangeFeed`) and reads what is new: there is no
fixed-interval polling of the journal. A run that another process is running can only be followed by reading its
shared journal, every ``follow_interval`` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from planweave.engine.events import Event
from planweave.engine.runtime import Engine, Run
from planweave.journal.base import Journal, encode_data
from planweave.server.runs import active_run


class ChangeFeed:
    """Wakes the streams waiting on a run (or on any run) when the engine emits an event.

    The engine calls :meth:`notify` synchronously for every event, so it only sets the :class:`asyncio.Event` of
    the current waiters; each waiter takes a fresh one with :meth:`changed` *before* it reads the journal, so an event
    emitted while it reads wakes it at once instead of being missed.
    """

    def __init__(self) -> None:
        self._by_run: dict[str, asyncio.Event] = {}
        self._any: asyncio.Event | None = None
        self._hooked: set[str] = set()
        self.closed = False

    def notify(self, event: Event) -> None:
        """The engine listener: wake whoever waits on this run or on every run."""
        waiting = self._by_run.pop(event.run_id, None)
        if waiting is not None:
            waiting.set()
        if self._any is not None:
            self._any.set()
            self._any = None

    def changed(self, run_id: str | None) -> asyncio.Event:
        """An event set at the next change of ``run_id`` (None: of any run), or at once if the feed is closed."""
        if self.closed:
            done = asyncio.Event()
            done.set()
            return done
        if run_id is None:
            if self._any is None:
                self._any = asyncio.Event()
            return self._any
        waiting = self._by_run.get(run_id)
        if waiting is None:
            waiting = self._by_run[run_id] = asyncio.Event()
        return waiting

    def hook(self, run: Run) -> None:
        """Also listen to ``run`` directly: needed for runs started before the feed subscribed to the engine."""
        if run.id not in self._hooked:
            self._hooked.add(run.id)
            run.subscribe(self.notify)

    def close(self) -> None:
        """Wake every stream for good: the server is shutting down and they must end."""
        self.closed = True
        for waiting in self._by_run.values():
            waiting.set()
        self._by_run.clear()
        if self._any is not None:
            self._any.set()
            self._any = None


def encode_sse(event: Event) -> bytes:
    """One event in the SSE wire format: its journal position as ``id``, its kind as ``event``, its JSON as data."""
    data = encode_data(event.to_json())  # one line: orjson never emits raw newlines
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.pos or 0, event.kind.encode(), data)


PING = b": ping\n\n"


@dataclass(frozen=True)
class StreamTiming:
    """How often a stream pings an idle client, and reads the journal for runs that other processes write."""

    ping_interval: float = 15.0
    follow_interval: float = 1.0


async def _wait(changed: asyncio.Event, timeout: float) -> bool:
    """Wait for ``changed`` at most ``timeout`` seconds; return whether it was set."""
    try:
        async with asyncio.timeout(timeout):
            await changed.wait()
    except TimeoutError:
        return False
    return True


async def run_events(
    engine: Engine, journal: Journal, feed: ChangeFeed, run_id: str, after: int, timing: StreamTiming
) -> AsyncIterator[bytes]:
    """The SSE stream of one run: its events after ``after``, then live ones; it ends after ``run_finished``.

    A run resumed later gets a new stream (resume it from the last id seen: nothing is sent twice).
    """
    pos = after
    finished = False
    idle = 0.0
    while not feed.closed:
        run = active_run(engine, run_id)
        if run is not None:
            feed.hook(run)
        changed = feed.changed(run_id)  # taken before the read: what happens meanwhile still wakes us
        events = await journal.read(run_id, after=pos)
        for event in events:
            pos = event.pos or pos
            if event.kind == "run_finished":
                finished = True
            elif event.kind in ("run_created", "run_resumed"):
                finished = False
            yield encode_sse(event)
        if finished:
            return
        if run is not None:
            # Active here: the engine's listener wakes us; until then only keep the connection alive.
            while not await _wait(changed, timing.ping_interval):
                yield PING
            continue
        # Another process runs it (or nobody does now): only the shared journal can tell, so read it now and then.
        idle = 0.0 if events else idle
        if not await _wait(changed, timing.follow_interval):
            idle += timing.follow_interval
            if idle >= timing.ping_interval:
                idle = 0.0
                yield PING


async def all_events(journal: Journal, feed: ChangeFeed, after: int, timing: StreamTiming) -> AsyncIterator[bytes]:
    """The SSE stream of every run's events after ``after``, live until the client leaves or the server stops.

    It wakes on this engine's events and, while idle, also reads the journal every ``follow_interval`` seconds to
    show the runs that other processes write to the same journal.
    """
    pos = after
    idle = 0.0
    while not feed.closed:
        changed = feed.changed(None)
        events = await journal.read(None, after=pos)
        for event in events:
            pos = event.pos or pos
            yield encode_sse(event)
        idle = 0.0 if events else idle
        if not await _wait(changed, timing.follow_interval):
            idle += timing.follow_interval
            if idle >= timing.ping_interval:
                idle = 0.0
                yield PING
