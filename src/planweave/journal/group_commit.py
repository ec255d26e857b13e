"""Group commit: the buffering, batching and failure handling shared by the durable journals.

``append`` and ``put_blob`` encode what they are given (so data that cannot be stored is refused right there, and a
batch only ever carries bytes) and add it to an in-memory buffer (they sit on the engine's hot path). One background
task per journal takes *everything* buffered so far and stores it as one transaction; whatever is appended while
that transaction is being written forms the next batch. A durable commit (an fsync) therefore costs the same
whether it carries one event or ten thousand, and throughput grows with load instead of collapsing under it.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from planweave.core.errors import JournalError
from planweave.core.events import Event
from planweave.journal.base import ReplyWritten, decode_blob, encode_blob, encode_event
from planweave.journal.summary import (
    ALL_RUNS,
    ENDED,
    PRUNE_DEFAULT,
    BatchRun,
    PruneResult,
    RunPage,
    RunQuery,
    RunSummary,
    check_prunable,
    fold_summary,
    summarise,
)

if TYPE_CHECKING:
    from planweave.core.state import RunState

#: A tracked run with more steps than this is summarised at most every _SUMMARY_INTERVAL_S (a summary counts its
#: steps, so a long chain written in many small batches would pay its length per batch), unless the batch holds a
#: run-level or people event; in between its row is marked stale, and a listing meanwhile folds it instead.
_CHEAP_STEPS = 200
_SUMMARY_INTERVAL_S = 0.25
_LOUD_KINDS = frozenset({"run_created", "run_resumed", "run_finished", "approval_requested", "approval_given",
                         "input_requested", "input_given"})
#: A backfill stores what it folded every this many runs (an interrupted one keeps its progress).
_STORE_EVERY = 500


def event_filter(run_id: str | None, after: int, kind: str | None, mark: str) -> tuple[str, list[Any]]:
    """The WHERE condition and parameters of an events query (``mark``: the driver's placeholder, ``?`` or ``%s``)."""
    where: list[str] = [f"pos > {mark}"]
    params: list[Any] = [after]
    if run_id is not None:
        where.insert(0, f"run_id = {mark}")
        params.insert(0, run_id)
    if kind is not None:
        where.append(f"kind = {mark}")
        params.append(kind)
    return " AND ".join(where), params


def run_filter(query: RunQuery, mark: str) -> tuple[str, list[Any]]:
    """The `` WHERE ...`` clause (or nothing) and parameters of a run listing's query on the summary table."""
    where: list[str] = []
    params: list[Any] = []
    if query.statuses is not None:
        statuses = sorted(query.statuses) or [""]
        where.append(f"status IN ({', '.join([mark] * len(statuses))})")
        params.extend(statuses)
    if query.since is not None:
        where.append(f"started_at >= {mark}")
        params.append(query.since)
    if query.before is not None:
        where.append(f"seq < {mark}")
        params.append(query.before)
    return (" WHERE " + " AND ".join(where) if where else ""), params


def run_page(rows: list[tuple[Any, ...]], query: RunQuery, position: int) -> RunPage:
    """The page of summary rows (``run_id, seq, status, started_at, finished_at, owner, source, summary``; one more
    than the limit if there is a next page)."""
    more = query.limit is not None and len(rows) > query.limit
    shown = rows[: query.limit] if more else rows
    runs = [
        RunSummary.from_row(run_id, seq, status, started, finished, _json(owner), source, _json(doc) or {})
        for run_id, seq, status, started, finished, owner, source, doc in shown
    ]
    return RunPage(runs, runs[-1].seq if more else None, position)


def _json(value: Any) -> Any:
    if value is None or isinstance(value, dict):
        return value  # PostgreSQL's JSONB arrives decoded
    return decode_blob(value)


class GroupCommitJournal(ABC):
    """A journal whose buffered events and blobs are written by one background task, one transaction per batch.

    Subclasses implement :meth:`_write` (store one batch atomically), the ``_select*`` read methods and
    :meth:`_release`, and start the writer with :meth:`_start` once connected. All methods must be called from
    the thread running the event loop the journal was opened on.

    A failed write is final: every later ``flush`` (and ``close``) raises :class:`JournalError` naming the cause.
    Retrying would store the events after the lost batch without it, and a replay of such a journal would be
    wrong (a step succeeding that never started), so the journal refuses to pretend instead.
    """

    durable = True

    def __init__(self, url: str) -> None:
        self.url = url
        #: Transactions committed by the writer so far (one per batch): lets tests and benchmarks see batching.
        self.commits = 0
        self._events: list[tuple[Event, bytes]] = []
        self._blobs: dict[str, bytes] = {}
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        # Completes when the batch that will take the current buffer is committed.
        self._next: asyncio.Future[None] = loop.create_future()
        # Completes when the batch being written now is committed (None: no write in progress).
        self._inflight: asyncio.Future[None] | None = None
        self._failure: tuple[str, BaseException | None] | None = None
        self._closed = False
        self._released = False
        self._stopping = False
        self._writer: asyncio.Task[None] | None = None
        # run -> [its live state, events it had applied when tracked, events of the run batched since, when it was
        # last summarised (monotonic), what hides secrets in its texts]
        self._tracked: dict[str, list[Any]] = {}

    # -- the hot path ---------------------------------------------------------------------------------------------
    def append(self, event: Event) -> None:
        """Encode and buffer an event; raises EventNotRecorded (nothing buffered) if its data cannot be stored.

        Raises JournalError once closed.
        """
        if self._closed:
            raise JournalError(f"the journal {self.url} is closed: event '{event.kind}' was not recorded")
        self._events.append((event, self._encode(event)))
        self._wake.set()

    def put_blob(self, value: Any) -> str:
        """Buffer an output and return its content reference (raises OutputNotSerialisable right away)."""
        ref, data = encode_blob(value)
        if self._closed:
            raise JournalError(f"the journal {self.url} is closed: an output was not recorded")
        self._blobs[ref] = data
        self._wake.set()
        return ref

    # -- waiting for durability -----------------------------------------------------------------------------------
    async def flush(self) -> None:
        """Return once every event and blob buffered before the call is committed (raises JournalError if not)."""
        if self._failure is not None:
            raise self._error()
        if self._events or self._blobs:
            done = self._next
            self._wake.set()
        elif self._inflight is not None:
            done = self._inflight
        else:
            return
        # shield: a cancelled flush must not cancel the future other flushes are waiting on.
        await asyncio.shield(done)

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        """Stored events with ``pos > after`` in order, of one run or (``None``) of all runs; the first ``limit``.

        Events appended before the call are included: it waits for them to be stored first, so a journal reads
        its own writes just like the in-memory one.
        """
        await self._settle()
        return await self._select(run_id, after, kind, limit)

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        """The outputs stored under ``refs`` (missing ones are left out), including ones buffered before the call."""
        wanted = list(dict.fromkeys(refs))
        await self._settle()
        if not wanted:
            return {}
        return await self._select_blobs(wanted)

    async def run_ids(self) -> list[str]:
        """Every run in the journal (also those other processes wrote), oldest first."""
        await self._settle()
        return await self._select_run_ids()

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        """Summarise ``run_id`` from ``state`` once per batch that carries its events (see :meth:`_batch_runs`)."""
        self._tracked[run_id] = [state, state.events_applied, 0, 0.0, redact]

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        """Runs matching ``query``, newest first, read from their summaries (stale ones are folded first)."""
        await self._settle()
        await self._backfill()
        return await self._select_runs(query)

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        """Remove runs that ended before ``finished_before`` with a status in ``statuses``, in one transaction."""
        wanted = check_prunable(statuses)
        await self._settle()
        await self._backfill()
        return await self._delete_runs(finished_before, wanted)

    async def append_reply(self, event: Event) -> ReplyWritten:
        """Store a ``step_reply`` unless a reply stands for its step, checked and written in one transaction (see
        :meth:`planweave.journal.base.Journal.append_reply`); what is buffered here is stored first."""
        data = self._encode(event)
        await self._settle()
        return await self._append_reply(event, data)

    async def close(self) -> None:
        """Flush, stop the writer and release the connection; raises JournalError if buffered data was lost.

        Resources are released even then. Closing again does nothing.
        """
        if self._released:
            return
        self._closed = True  # refuse appends from now on: what close has flushed must be everything
        error: JournalError | None = None
        try:
            await self.flush()
        except JournalError as exc:
            error = exc
        finally:
            # Even if this close is cancelled, the writer stores what is buffered and then stops.
            self._stopping = True
            self._wake.set()
        if self._writer is not None:
            # wait(), not await: a writer that was cancelled must not make close() look cancelled.
            await asyncio.wait([self._writer])
        if self._released:  # a concurrent close() finished first
            return
        self._released = True
        try:
            await self._release()
        except Exception as exc:
            if error is None:
                error = JournalError(f"could not close the journal {self.url}: {exc}")
        if error is not None:
            raise error

    # -- for subclasses -------------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._writer = self._loop.create_task(self._write_loop(), name=f"planweave-journal-writer {self.url}")

    def _encode(self, event: Event) -> bytes:
        """The bytes stored for ``event``'s data (raises EventNotRecorded); backends may adapt them."""
        return encode_event(event, self.url)

    @abstractmethod
    async def _write(self, events: list[tuple[Event, bytes]], blobs: dict[str, bytes], runs: list[BatchRun]) -> None:
        """Store ``blobs`` (each once), ``events`` (in order, each with its encoded data) and the summaries of
        ``runs`` (a stale mark where a run's summary is None) in ONE transaction; raise JournalError on failure."""

    @abstractmethod
    async def _append_reply(self, event: Event, data: bytes) -> ReplyWritten:
        """In one transaction that excludes every other writer: the reply standing for ``event``'s step, else store
        ``event`` (``data``: its encoded data) and mark its run's summary stale."""

    @abstractmethod
    async def _select(self, run_id: str | None, after: int, kind: str | None, limit: int | None) -> list[Event]:
        """Stored events matching :func:`event_filter`, in order, at most ``limit`` (None: all) of them."""

    @abstractmethod
    async def _select_blobs(self, refs: list[str]) -> dict[str, Any]: ...

    @abstractmethod
    async def _select_run_ids(self) -> list[str]: ...

    @abstractmethod
    async def _select_runs(self, query: RunQuery) -> RunPage: ...

    @abstractmethod
    async def _select_stale(self) -> list[tuple[str, int]]:
        """The runs whose summary is stale, as (run id, seq)."""

    @abstractmethod
    async def _store_summaries(self, summaries: list[tuple[RunSummary, int]]) -> None:
        """Store folded summaries, each as of the event position given, unless a later batch wrote the run since."""

    @abstractmethod
    async def _delete_runs(self, finished_before: float, statuses: frozenset[str]) -> PruneResult: ...

    @abstractmethod
    async def _release(self) -> None:
        """Close the connection (called once, after the writer has stopped)."""

    # -- internals ------------------------------------------------------------------------------------------------
    def _batch_runs(self, events: list[tuple[Event, bytes]]) -> list[BatchRun]:
        """The runs of a batch being taken, each with its summary: a tracked run's is its state's (once per batch,
        not per event) while every event of the run went through that state; otherwise it is stale."""
        found: dict[str, BatchRun] = {}
        counts: dict[str, int] = {}
        loud: set[str] = set()
        for i, (event, _) in enumerate(events):
            run_id = event.run_id
            run = found.get(run_id)
            if run is None:
                found[run_id] = run = BatchRun(run_id, i, i)
                counts[run_id] = 1
            else:
                run.last = i
                counts[run_id] += 1
            kind = event.kind
            if kind in _LOUD_KINDS:
                loud.add(run_id)
            if kind == "run_created" or kind == "run_resumed":
                run.owner = dict(event.data.get("owner") or {})
                if kind == "run_created":
                    run.source = str(event.data.get("source", ""))
        tracked = self._tracked
        now = time.monotonic()
        for run_id, run in found.items():
            entry = tracked.get(run_id)
            if entry is None:
                continue
            state, applied, seen, last, redact = entry
            entry[2] = seen = seen + counts[run_id]
            # The engine appends an event, then applies it: a count that differs means another writer's event
            # (a cancel from outside the engine) is in the run, and only a fold of the stored events is right.
            if state.events_applied - applied != seen:
                del tracked[run_id]
                continue
            if len(state.records) > _CHEAP_STEPS and run_id not in loud and now - last < _SUMMARY_INTERVAL_S:
                continue  # stale until the next summary (see _CHEAP_STEPS)
            entry[3] = now
            run.summary = summarise(state, updated_at=events[run.last][0].at, redact=redact)
            if state.status in ENDED:
                del tracked[run_id]  # a resume tracks it again
        return list(found.values())

    async def _backfill(self) -> None:
        """Fold the runs whose summaries are stale and store them (a migrated journal: every run, once)."""
        stale = await self._select_stale()
        if not stale:
            return
        folded: list[tuple[RunSummary, int]] = []
        # Run by run (the (run_id, pos) index): memory bounded by the largest run, not the journal; a migrated
        # 10,000-run journal of 50 MiB folds in about 5 s once (one pass over all events: 4 s, but 2x the memory).
        for run_id, seq in stale:
            events = await self._select(run_id, 0, None, None)
            if events:
                folded.append((fold_summary(run_id, events, seq), events[-1].pos or 0))
            if len(folded) >= _STORE_EVERY:
                await self._store_summaries(folded)
                folded = []
        await self._store_summaries(folded)

    async def _settle(self) -> None:
        if self._released:
            raise JournalError(f"the journal {self.url} is closed")
        await self.flush()

    async def _write_loop(self) -> None:
        try:
            while True:
                # The buffer, not the wake-up, decides: a wake-up set while a batch was being written may
                # already have been consumed, and what arrived meanwhile must still be written (or, when
                # stopping, the writer must still notice the buffer is empty and return).
                if not self._events and not self._blobs:
                    if self._stopping:
                        return
                    await self._wake.wait()
                    self._wake.clear()
                    continue
                events, self._events = self._events, []
                blobs, self._blobs = self._blobs, {}
                done, self._next = self._next, self._loop.create_future()
                self._inflight = done
                await self._write(events, blobs, self._batch_runs(events))
                self.commits += 1
                self._inflight = None
                done.set_result(None)
        except JournalError as exc:
            self._fail(str(exc), exc.__cause__)
        except asyncio.CancelledError:
            self._fail(f"the journal {self.url} stopped writing: its writer task was cancelled", None)
            raise
        except Exception as exc:  # a bug here must fail the flushes visibly, not leave them waiting forever
            self._fail(f"the journal {self.url} stopped writing: {type(exc).__name__}: {exc}", exc)

    def _fail(self, message: str, cause: BaseException | None) -> None:
        if self._failure is None:
            self._failure = (message, cause)
        for fut in (self._inflight, self._next):
            if fut is not None and not fut.done():
                fut.set_exception(self._error())
                fut.exception()  # mark retrieved: nobody may be flushing right now
        self._inflight = None

    def _error(self) -> JournalError:
        # A fresh exception per raise: re-raising one instance would pile up tracebacks from every caller.
        assert self._failure is not None
        message, cause = self._failure
        error = JournalError(message)
        error.__cause__ = cause
        return error
