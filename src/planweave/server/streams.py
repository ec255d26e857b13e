"""Server-sent event streams of journaled events, resumable by journal position and live by notification.

Every event goes out as ``id: <journal pos>``, ``event: <kind>``, ``data: <event JSON>``. A stream first replays
the journal after the client's ``Last-Event-ID``, then waits. While the run is active in this process it waits for
the engine's listener to say that something happened (:class:`ChangeFeed`) and reads what is new: there is no
fixed-interval polling of the journal. A run that another process is running can only be followed by reading its
shared journal, every ``follow_interval`` seconds.

A stream holds at most one page of events (:class:`StreamLimits`): it reads ``page_size`` events from the journal,
hands them to the client one by one, and reads the next page only once the client has taken the last event of this
one (uvicorn writes only while the connection's buffer has room, so a client that does not read stops its stream's
reads; :mod:`planweave.server.connections` drops it once it has read nothing for a while). The journal, not the
server, keeps the backlog: a hundred slow clients cost a hundred pages, not a hundred copies of the journal. A
stream that has caught up with the live events once and then falls more than ``max_lag`` events behind them ends
with a ``lagging`` event naming the position to resume from: the client reconnects with ``Last-Event-ID`` (an
``EventSource`` does so by itself) and reads on from the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from planweave.core.events import Event
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


def encode_lagging(pos: int, limit: int) -> bytes:
    """The last message of a stream that fell more than ``limit`` events behind: read on after ``pos``. It has no
    ``id:`` (the last event's is the one to resume from)."""
    data = encode_data({"after": pos, "max_lag": limit,
                        "message": f"this stream fell more than {limit} events behind the live ones and was ended: "
                                   f"reconnect with Last-Event-ID: {pos} to read on from the journal"})
    return b"event: lagging\ndata: %s\n\n" % data


PING = b": ping\n\n"


@dataclass(frozen=True)
class StreamTiming:
    """How often a stream pings an idle client, and reads the journal for runs that other processes write."""

    ping_interval: float = 15.0
    follow_interval: float = 1.0


@dataclass(frozen=True)
class StreamLimits:
    """How much of the journal one client's stream holds at a time, and how far behind the live events it may fall.

    ``page_size``: events read from the journal at a time (the next page only once the client took this one).
    ``max_lag``: events a stream that had caught up may then fall behind before it ends with ``lagging``.
    """

    page_size: int = 256
    max_lag: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= self.max_lag:
            raise ValueError(f"stream limits need 1 <= page_size <= max_lag, got {self.page_size} and {self.max_lag}")


async def _wait(changed: asyncio.Event, timeout: float) -> bool:
    """Wait for ``changed`` at most ``timeout`` seconds; return whether it was set."""
    try:
        async with asyncio.timeout(timeout):
            await changed.wait()
    except TimeoutError:
        return False
    return True


class _Lag:
    """How far a stream is behind the live events: not bounded while it replays what its client asked for (until
    it first catches up), then the events it has read since it last caught up."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._behind: int | None = None

    def read(self, events: int, full: bool) -> bool:
        """Count a page of ``events`` (``full``: more may follow at once); whether the stream is now too far behind."""
        if not full:
            self._behind = 0  # caught up: what follows is live
            return False
        if self._behind is None:
            return False
        self._behind += events
        return self._behind > self.limit


async def run_events(
    engine: Engine, journal: Journal, feed: ChangeFeed, run_id: str, after: int, timing: StreamTiming,
    limits: StreamLimits = StreamLimits(),
) -> AsyncIterator[bytes]:
    """The SSE stream of one run: its events after ``after``, then live ones; it ends after ``run_finished``.

    A run resumed later gets a new stream (resume it from the last id seen: nothing is sent twice).
    """
    pos = after
    finished = False
    idle = 0.0
    lag = _Lag(limits.max_lag)
    while not feed.closed:
        run = active_run(engine, run_id)
        if run is not None:
            feed.hook(run)
        changed = feed.changed(run_id)  # taken before the read: what happens meanwhile still wakes us
        page = await journal.read(run_id, after=pos, limit=limits.page_size)
        count = len(page)
        for event in page:
            pos = event.pos or pos
            if event.kind == "run_finished":
                finished = True
            elif event.kind in ("run_created", "run_resumed"):
                finished = False
            yield encode_sse(event)
        del page  # taken by the client: nothing of it is held while the stream waits
        if finished:
            return
        full = count == limits.page_size
        if lag.read(count, full):
            yield encode_lagging(pos, limits.max_lag)
            return
        if full:
            continue  # more is stored: the next page, now that the client took this one
        if run is not None:
            # Active here: the engine's listener wakes us; until then only keep the connection alive.
            while not await _wait(changed, timing.ping_interval):
                yield PING
            continue
        # Another process runs it (or nobody does now): only the shared journal can tell, so read it now and then.
        idle = 0.0 if count else idle
        if not await _wait(changed, timing.follow_interval):
            idle += timing.follow_interval
            if idle >= timing.ping_interval:
                idle = 0.0
                yield PING


async def all_events(
    journal: Journal, feed: ChangeFeed, after: int, timing: StreamTiming, limits: StreamLimits = StreamLimits(),
) -> AsyncIterator[bytes]:
    """The SSE stream of every run's events after ``after``, live until the client leaves or the server stops.

    It wakes on this engine's events and, while idle, also reads the journal every ``follow_interval`` seconds to
    show the runs that other processes write to the same journal.
    """
    pos = after
    idle = 0.0
    lag = _Lag(limits.max_lag)
    while not feed.closed:
        changed = feed.changed(None)
        page = await journal.read(None, after=pos, limit=limits.page_size)
        count = len(page)
        for event in page:
            pos = event.pos or pos
            yield encode_sse(event)
        del page
        full = count == limits.page_size
        if lag.read(count, full):
            yield encode_lagging(pos, limits.max_lag)
            return
        if full:
            continue
        idle = 0.0 if count else idle
        if not await _wait(changed, timing.follow_interval):
            idle += timing.follow_interval
            if idle >= timing.ping_interval:
                idle = 0.0
                yield PING
