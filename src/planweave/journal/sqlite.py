"""A SQLite journal: one file, WAL mode, ``synchronous=FULL`` (durable against power loss), with group commit.

Every database call runs on one dedicated thread that owns the only connection, so the event loop never
blocks on disk and SQLite's objects never cross threads. Events arrive encoded (``append`` refuses data that
cannot be stored), so a batch never fails for one event's contents. Several processes may share a file: writers
queue on SQLite's write lock (``busy_timeout``) and WAL lets readers proceed meanwhile.

URLs: ``sqlite:///relative/path.db`` (relative to the working directory), ``sqlite:////abs/path.db``,
``sqlite:///:memory:`` (one connection, so it works, but nothing survives ``close``).

A damaged file is said so, naming it and what to do (:func:`_failed`): when a run finishes, and when the journal
closes, what was written is read back on a connection of its own and the write-ahead log's header is checked
(:func:`_verify`). A WAL overwritten while this process wrote to it (zeroed: the run went on, reported success, and
its checkpoint then left a file SQLite cannot open) fails the run's final flush instead of passing for a success.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import orjson

from planweave.core.errors import JournalError
from planweave.core.events import Event
from planweave.core.replies import REPLY_KINDS, standing_reply
from planweave.journal.base import CachedOutput, ReplyWritten, cache_entries, decode_blob
from planweave.journal.group_commit import GroupCommitJournal, event_filter, run_filter, run_page
from planweave.journal.summary import BatchRun, PruneResult, RunPage, RunQuery, RunSummary

__all__ = ["BUSY_TIMEOUT_S", "SCHEMA_VERSION", "SQLiteJournal"]

T = TypeVar("T")

#: Version of the tables below, kept in ``meta``; bump it and add its statements to ``_MIGRATIONS`` when they change.
SCHEMA_VERSION = 3
#: How long a write waits for another process holding the file's write lock before it fails.
BUSY_TIMEOUT_S = 30.0
# SQLite limits the number of ``?`` in one statement (999 before 3.32); stay well below.
_MAX_VARS = 500

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS events (
        pos INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        step TEXT,
        data BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS events_run ON events (run_id, pos)",
    "CREATE TABLE IF NOT EXISTS blobs (ref TEXT PRIMARY KEY, data BLOB NOT NULL)",
)
# Version 2: one summary row per run (planweave.journal.summary), written with the batch that changes it. ``seq`` is
# the position of the run's first event, ``pos`` of the last one summarised; ``stale`` rows are folded on listing.
_RUNS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at REAL,
        finished_at REAL,
        stale INTEGER NOT NULL,
        owner TEXT,
        source TEXT,
        summary BLOB
    )""",
    "CREATE INDEX IF NOT EXISTS runs_seq ON runs (seq)",
    "CREATE INDEX IF NOT EXISTS runs_status ON runs (status, seq)",
    "CREATE INDEX IF NOT EXISTS runs_stale ON runs (stale) WHERE stale = 1",
    # Runs journaled before summaries existed: every one starts stale, so the first listing folds each once.
    "INSERT OR IGNORE INTO runs (run_id, seq, pos, status, stale) "
    "SELECT run_id, MIN(pos), MAX(pos), 'running', 1 FROM events GROUP BY run_id",
)
# Version 3: the result cache's index (docs/caching.md): one row per ``step_succeeded`` carrying a ``cache_key``,
# written in the batch of its event and deleted with its run by prune. Older journals are indexed from their events.
_CACHE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cache (
        key TEXT NOT NULL,
        at REAL NOT NULL,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        output TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS cache_key ON cache (key, at)",
    "CREATE INDEX IF NOT EXISTS cache_run ON cache (run_id)",
    "INSERT INTO cache (key, at, run_id, step, output) "
    "SELECT json_extract(CAST(data AS TEXT), '$.cache_key'), at, run_id, step, "
    "json_extract(CAST(data AS TEXT), '$.output') FROM events WHERE kind = 'step_succeeded' AND step IS NOT NULL "
    "AND json_type(CAST(data AS TEXT), '$.cache_key') = 'text' AND json_type(CAST(data AS TEXT), '$.output') = 'text' "
    "AND json_type(CAST(data AS TEXT), '$.cache') IS NULL AND NOT EXISTS (SELECT 1 FROM cache) ORDER BY pos",
)
#: The statements that take the tables from version ``n - 1`` to ``n``.
_MIGRATIONS: dict[int, tuple[str, ...]] = {1: _SCHEMA, 2: _RUNS_SCHEMA, 3: _CACHE_SCHEMA}
_INSERT_CACHE = "INSERT INTO cache (key, at, run_id, step, output) VALUES (?, ?, ?, ?, ?)"
_FIND_CACHED = ("SELECT c.run_id, c.step, c.at, c.output, b.data FROM cache c JOIN blobs b ON b.ref = c.output "
                "WHERE c.key = ? AND c.at >= ? ORDER BY c.at DESC, c.rowid DESC LIMIT 1")
_UPSERT_SUMMARY = (
    "INSERT INTO runs (run_id, seq, pos, status, started_at, finished_at, stale, owner, source, summary) "
    "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET pos = excluded.pos, "
    "status = excluded.status, started_at = excluded.started_at, finished_at = excluded.finished_at, stale = 0, "
    "owner = COALESCE(excluded.owner, owner), source = COALESCE(excluded.source, source), summary = excluded.summary"
)
_MARK_STALE = (
    "INSERT INTO runs (run_id, seq, pos, status, stale, owner, source) VALUES (?, ?, ?, 'running', 1, ?, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET pos = excluded.pos, stale = 1, owner = COALESCE(excluded.owner, owner), "
    "source = COALESCE(excluded.source, source)"
)
_STORE_FOLDED = (
    "UPDATE runs SET status = ?, started_at = ?, finished_at = ?, owner = ?, source = ?, summary = ?, stale = 0 "
    "WHERE run_id = ? AND stale = 1 AND pos <= ?"
)
_RUN_COLUMNS = "run_id, seq, status, started_at, finished_at, owner, source, summary"
_INSERT_EVENT = "INSERT INTO events (run_id, at, kind, step, data) VALUES (?, ?, ?, ?, ?)"
# A batch's events go in _ROWS_PER_INSERT at a time: one statement per row costs SQLite a statement's set-up and
# AUTOINCREMENT's sqlite_sequence update per event, and the writer a GIL hand-over to the loop per event (27,000
# -> 16,000 instructions per event; docs/benchmarks.md, "The engine at the floor"). Rows keep their order, so
# their positions stay consecutive and in append order.
_ROWS_PER_INSERT = _MAX_VARS // 5
_INSERT_EVENTS = _INSERT_EVENT.replace("(?, ?, ?, ?, ?)", ", ".join(["(?, ?, ?, ?, ?)"] * _ROWS_PER_INSERT))
_INSERT_BLOB = "INSERT OR IGNORE INTO blobs (ref, data) VALUES (?, ?)"
_COLUMNS = "pos, run_id, at, kind, step, data"


def path_of(url: str) -> str:
    """The file path a ``sqlite://`` URL names (``:memory:`` for an in-memory database); raises JournalError."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise JournalError(f"journal URL '{url}' is not a SQLite URL: use sqlite:///relative.db or sqlite:////abs.db")
    # urlsplit keeps the slash after the (empty) host: drop it, so three slashes mean relative and four absolute.
    path = unquote(parts.path)[1:]
    if not path:
        raise JournalError(f"journal URL '{url}' names no file: use sqlite:///relative.db or sqlite:////abs.db")
    return path


class SQLiteJournal(GroupCommitJournal):
    """A durable journal in one SQLite file; open it with :meth:`open` (or :func:`planweave.journal.open_journal`)."""

    def __init__(self, url: str, path: str, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        super().__init__(url)
        self.path = path
        self._executor = executor
        self._conn = conn
        self._reader: ThreadPoolExecutor | None = None  # find_cached's thread, with its own connection
        self._last_run: str | None = None  # the run of the last event written: read back at close

    @classmethod
    async def open(cls, url: str) -> SQLiteJournal:
        """Open (creating the file, its parent directories and the tables if needed) the journal at ``url``."""
        path = path_of(url)
        # One worker, never replaced: the connection is created and used on this thread only.
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planweave-sqlite")
        try:
            conn = await asyncio.get_running_loop().run_in_executor(executor, _connect, url, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        journal = cls(url, path, executor, conn)
        journal._start()
        return journal

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` on the journal's thread (tests use it to reach the connection)."""
        return await self._loop.run_in_executor(self._executor, fn, self._conn, *args)

    async def _write(self, events: list[tuple[Event, bytes]], blobs: dict[str, bytes], runs: list[BatchRun]) -> None:
        await self._call(_write_batch, self.url, events, blobs, runs, cache_entries(events))
        if events and self.path != ":memory:":
            self._last_run = events[-1][0].run_id
            for event, _ in events:
                if event.kind == "run_finished":  # the run's final flush: its events must read back
                    await self._call(_verify, self.url, self.path, event.run_id, True)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        """The newest output indexed under ``key`` produced at or after ``since`` (what is committed).

        Read on a connection and thread of its own (WAL lets it read while a batch commits): a lookup never queues
        behind the writer's fsync (bench cache: 1.4 ms a step on the writer's thread).
        """
        if self._released:
            raise JournalError(f"the journal {self.url} is closed")
        if self.path == ":memory:":  # a second connection would open another, empty database
            row = await self._call(_reading(self.url, lambda c: c.execute(_FIND_CACHED, (key, since)).fetchone()))
        else:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planweave-sqlite-reader")
            row = await self._loop.run_in_executor(self._reader, _find_cached, self.url, self.path, key, since)
        if row is None:
            return None
        return CachedOutput(row[0], row[1], float(row[2]), row[3], decode_blob(row[4]))

    async def _append_reply(self, event: Event, data: bytes) -> ReplyWritten:
        return await self._call(_append_reply, self.url, event, data)

    async def _select(self, run_id: str | None, after: int, kind: str | None, limit: int | None) -> list[Event]:
        return await self._call(_select_events, self.url, run_id, after, kind, limit)

    async def _select_blobs(self, refs: list[str]) -> dict[str, Any]:
        return await self._call(_select_blobs, self.url, refs)

    async def _select_run_ids(self) -> list[str]:
        return await self._call(_select_run_ids, self.url)

    async def _select_runs(self, query: RunQuery) -> RunPage:
        return await self._call(_select_runs, self.url, query)

    async def _select_stale(self) -> list[tuple[str, int]]:
        return await self._call(_reading(self.url, lambda c: c.execute(
            "SELECT run_id, seq FROM runs WHERE stale = 1 ORDER BY seq").fetchall()))

    async def _store_summaries(self, summaries: list[tuple[RunSummary, int]]) -> None:
        await self._call(_store_summaries, self.url, summaries)

    async def _delete_runs(self, finished_before: float, statuses: frozenset[str]) -> PruneResult:
        return await self._call(_delete_runs, self.url, finished_before, statuses)

    async def _release(self) -> None:
        closed = False
        damage: JournalError | None = None
        if self._last_run is not None:
            try:
                await self._call(_verify, self.url, self.path, self._last_run, False)
            except JournalError as exc:
                damage = exc  # said once the connections are closed
        try:
            await self._call(_close)
            if self._reader is not None:
                await self._loop.run_in_executor(self._reader, _close_reader)
            closed = True
        finally:
            # Once their connections are closed the threads are idle: join them (at once), so that no thread of the
            # journal outlives it (`planweave run` took one still ending for a tool's lingering thread and left with
            # os._exit). After a failure, do not wait on a thread that may be stuck.
            self._executor.shutdown(wait=closed)
            if self._reader is not None:
                self._reader.shutdown(wait=closed)
        if damage is not None:
            raise damage


# -- everything below runs on the journal's thread ----------------------------------------------------------------
_WAL_MAGIC = (0x377F0682, 0x377F0683)  # the first four bytes of every WAL file SQLite writes (big-endian)
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _failed(url: str, action: str, exc: Exception) -> JournalError:
    """The error for ``exc`` met while trying to ``action`` the journal: a damaged file is named with what to do."""
    if getattr(exc, "sqlite_errorname", "").startswith(_DAMAGED):
        return JournalError(f"could not {action} the journal {url}: {_damaged(url, str(exc))}")
    return JournalError(f"could not {action} the journal {url}: {exc}")


def _damaged(url: str, problem: str) -> str:
    try:
        where = str(Path(path_of(url)).resolve())
    except JournalError:
        where = url
    return (f"the journal file {where} is damaged ({problem}): runs recorded there may be lost or unreadable. "
            f"Stop every process using it, then restore it from a backup, or move it aside (with its -wal and -shm "
            f"files) to start a new journal; `sqlite3 {where} .recover` may save what it still holds")


def _wal_problem(path: str) -> str | None:
    """Why the WAL of the database at ``path`` is not SQLite's, or None (also when there is none, or it is being
    created: fewer bytes than a header)."""
    try:
        with open(f"{path}-wal", "rb") as wal:
            header = wal.read(4)
    except FileNotFoundError:
        return None
    if len(header) < 4 or int.from_bytes(header, "big") in _WAL_MAGIC:
        return None
    return f"its write-ahead log {path}-wal was overwritten while this process wrote to it: its header is not SQLite's"


def _verify(conn: sqlite3.Connection, url: str, path: str, run_id: str, finished: bool) -> None:
    """Raise :class:`JournalError` if the journal is damaged: its WAL's header is not SQLite's, or ``run_id``'s events
    (``finished``: with its ``run_finished``) do not read back on a new connection.

    A new connection, because this one reads the pages it wrote from its cache: it sees nothing wrong with a WAL
    zeroed under it, which every other reader (and its own checkpoint at close) takes the zeros from. The read goes
    through the run's index entries and rows: O(the run's events), once per run and at close.
    """
    problem = _wal_problem(path)
    if problem is None:
        try:
            reader = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                     isolation_level=None)
            try:
                rows, _size, ends = reader.execute(
                    "SELECT count(*), sum(length(data)), coalesce(sum(kind = 'run_finished'), 0) FROM events "
                    "WHERE run_id = ?", (run_id,)).fetchone()
            finally:
                reader.close()
        except sqlite3.Error as exc:
            if not getattr(exc, "sqlite_errorname", "").startswith(_DAMAGED):
                return  # busy, or the file moved: nothing says it is damaged
            problem = f"the run {run_id!r} it just wrote does not read back: {exc}"
        else:
            if finished and (rows == 0 or not ends):  # at close, the run may have been pruned meanwhile
                problem = f"the run {run_id!r} it just wrote does not read back: its events are missing"
    if problem is not None:
        raise JournalError(_damaged(url, problem))


def _connect(url: str, path: str) -> sqlite3.Connection:
    try:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; batches use BEGIN IMMEDIATE explicitly (see _write_batch).
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise _failed(url, "open", exc) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # WAL: readers (also in other processes) never wait for the writer, and a commit is one sequential append.
        conn.execute("PRAGMA journal_mode = WAL")
        # FULL: the WAL is fsynced at every commit, so a flushed event survives power loss, not just a crash.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")  # the write lock: two processes opening a new file must not race
        try:
            _migrate(conn, url)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    except sqlite3.Error as exc:
        conn.close()
        raise _failed(url, "open", exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, url: str) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal {url} has schema version {version}, newer than this planweave supports "
            f"({SCHEMA_VERSION}): upgrade planweave"
        )
    if version < SCHEMA_VERSION:  # 0: a new file
        for step in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[step]:
                conn.execute(statement)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


def _write_batch(
    conn: sqlite3.Connection, url: str, events: list[tuple[Event, bytes]], blobs: dict[str, bytes],
    runs: list[BatchRun], cache: list[tuple[str, CachedOutput]],
) -> None:
    # The data as a bytearray: stored as the same BLOB, but the sqlite3 module binds bytes only after asking its
    # adapters about them (two failed attribute look-ups, each formatting an AttributeError: 3,300 instructions
    # per event, the copy 1,000; docs/benchmarks.md, "The engine at the floor").
    columns = [value for e, data in events for value in (e.run_id, e.at, e.kind, e.step, bytearray(data))]
    width = 5 * _ROWS_PER_INSERT
    whole = len(columns) - len(columns) % width
    try:
        # IMMEDIATE takes the write lock up front, waiting up to busy_timeout for other processes: the batch
        # never upgrades a read lock, the one case where SQLite answers SQLITE_BUSY without waiting.
        conn.execute("BEGIN IMMEDIATE")
        try:
            if blobs:
                conn.executemany(_INSERT_BLOB, blobs.items())
            if events:
                if whole:
                    conn.executemany(_INSERT_EVENTS, (columns[i : i + width] for i in range(0, whole, width)))
                if whole < len(columns):
                    conn.executemany(_INSERT_EVENT, (columns[i : i + 5] for i in range(whole, len(columns), 5)))
                if runs:
                    (last,) = conn.execute("SELECT last_insert_rowid()").fetchone()
                    _write_summaries(conn, runs, last - len(events) + 1)
                if cache:
                    conn.executemany(_INSERT_CACHE, [(k, e.at, e.run_id, e.step, e.output) for k, e in cache])
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    except sqlite3.Error as exc:
        raise _failed(url, "write to", exc) from exc


def _append_reply(conn: sqlite3.Connection, url: str, event: Event, data: bytes) -> ReplyWritten:
    marks = ", ".join("?" * len(REPLY_KINDS))
    try:
        # IMMEDIATE: the write lock before the check, so no other process (another reply, the run's own decision)
        # writes between the check and the insert.
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE run_id = ? AND step = ? AND kind IN ({marks}) "
                                "ORDER BY pos", (event.run_id, event.step, *REPLY_KINDS))
            standing = standing_reply(Event(r, k, a, s, decode_blob(d), p)
                                      for p, r, a, k, s, d in rows)
            if standing is not None:
                conn.execute("ROLLBACK")
                return ReplyWritten(False, standing)
            conn.execute(_INSERT_EVENT, (event.run_id, event.at, event.kind, event.step, data))
            (pos,) = conn.execute("SELECT last_insert_rowid()").fetchone()
            conn.execute(_MARK_STALE, (event.run_id, pos, pos, None, None))  # another writer's event: fold it
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    except sqlite3.Error as exc:
        raise JournalError(f"could not write to the journal {url}: {exc}") from exc
    return ReplyWritten(True, event._replace(pos=int(pos)))


def _write_summaries(conn: sqlite3.Connection, runs: list[BatchRun], first_pos: int) -> None:
    """Upsert the summary rows of a batch whose first event got ``first_pos`` (positions are consecutive: the
    batch holds the write lock)."""
    fresh, stale = [], []
    for run in runs:
        owner = orjson.dumps(run.owner) if run.owner is not None else None
        summary = run.summary
        if summary is None:
            stale.append((run.run_id, first_pos + run.first, first_pos + run.last, owner, run.source))
        else:
            fresh.append((run.run_id, first_pos + run.first, first_pos + run.last, summary.status, summary.started_at,
                          summary.finished_at, owner, run.source, orjson.dumps(summary.document())))
    if fresh:
        conn.executemany(_UPSERT_SUMMARY, fresh)
    if stale:
        conn.executemany(_MARK_STALE, stale)


def _reading(url: str, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    def read(conn: sqlite3.Connection) -> T:
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            raise _failed(url, "read", exc) from exc

    return read


def _select_runs(conn: sqlite3.Connection, url: str, query: RunQuery) -> RunPage:
    where, params = run_filter(query, "?")
    limit = "" if query.limit is None else f" LIMIT {int(query.limit) + 1}"
    try:
        (position,) = conn.execute("SELECT coalesce(max(pos), 0) FROM events").fetchone()  # first: nothing missed
        rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs{where} ORDER BY seq DESC{limit}", params).fetchall()
    except sqlite3.Error as exc:
        raise _failed(url, "read", exc) from exc
    return run_page(rows, query, int(position))


def _store_summaries(conn: sqlite3.Connection, url: str, summaries: list[tuple[RunSummary, int]]) -> None:
    rows = [(s.status, s.started_at, s.finished_at, orjson.dumps(dict(s.owner)), s.source,
             orjson.dumps(s.document()), s.run_id, pos) for s, pos in summaries]
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_STORE_FOLDED, rows)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    except sqlite3.Error as exc:
        raise _failed(url, "write to", exc) from exc


def _delete_runs(conn: sqlite3.Connection, url: str, finished_before: float, statuses: frozenset[str]) -> PruneResult:
    marks = ", ".join("?" * len(statuses))
    try:
        size_before = _database_bytes(conn)
        conn.execute("BEGIN IMMEDIATE")  # writers wait: a run cannot be resumed between the check and the delete
        try:
            doomed = [r for (r,) in conn.execute(
                f"SELECT run_id FROM runs WHERE stale = 0 AND status IN ({marks}) AND finished_at < ? ORDER BY seq",
                (*sorted(statuses), finished_before))]
            events = freed = 0
            refs: set[str] = set()
            for i in range(0, len(doomed), _MAX_VARS):
                chunk = doomed[i : i + _MAX_VARS]
                ids = ", ".join("?" * len(chunk))
                refs.update(ref for (ref,) in conn.execute(
                    "SELECT DISTINCT json_extract(CAST(data AS TEXT), '$.output') FROM events "
                    f"WHERE run_id IN ({ids}) AND kind = 'step_succeeded'", chunk) if isinstance(ref, str))
                n, size = conn.execute(
                    f"SELECT count(*), coalesce(sum(length(data)), 0) FROM events WHERE run_id IN ({ids})", chunk
                ).fetchone()
                events, freed = events + n, freed + size
                conn.execute(f"DELETE FROM events WHERE run_id IN ({ids})", chunk)
                conn.execute(f"DELETE FROM runs WHERE run_id IN ({ids})", chunk)
                conn.execute(f"DELETE FROM cache WHERE run_id IN ({ids})", chunk)
            if refs:
                refs -= {ref for (ref,) in conn.execute(
                    "SELECT DISTINCT json_extract(CAST(data AS TEXT), '$.output') FROM events "
                    "WHERE kind = 'step_succeeded'")}
            gone = sorted(refs)
            outputs = 0
            for i in range(0, len(gone), _MAX_VARS):
                chunk = gone[i : i + _MAX_VARS]
                ids = ", ".join("?" * len(chunk))
                n, size = conn.execute(
                    f"SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs WHERE ref IN ({ids})", chunk
                ).fetchone()
                outputs, freed = outputs + n, freed + size
                conn.execute(f"DELETE FROM blobs WHERE ref IN ({ids})", chunk)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        file_freed = None
        if doomed:
            conn.execute("VACUUM")  # give the pages back to the file system
            file_freed = size_before - _database_bytes(conn)
    except sqlite3.Error as exc:
        raise _failed(url, "prune", exc) from exc
    return PruneResult(doomed, events, outputs, freed, file_freed)


def _database_bytes(conn: sqlite3.Connection) -> int:
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    (size,) = conn.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(size)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # SQLite rolls back by itself on most errors; the original error is the one to report


def _select_events(
    conn: sqlite3.Connection, url: str, run_id: str | None, after: int, kind: str | None = None,
    limit: int | None = None,
) -> list[Event]:
    where, params = event_filter(run_id, after, kind, "?")
    page = "" if limit is None else f" LIMIT {int(limit)}"
    try:
        cursor = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE {where} ORDER BY pos{page}", params)
        loads = decode_blob
        return [Event(r, k, a, s, loads(d), p) for p, r, a, k, s, d in cursor]
    except sqlite3.Error as exc:
        raise _failed(url, "read", exc) from exc


def _select_blobs(conn: sqlite3.Connection, url: str, refs: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        for i in range(0, len(refs), _MAX_VARS):
            chunk = refs[i : i + _MAX_VARS]
            marks = ", ".join("?" * len(chunk))
            for ref, data in conn.execute(f"SELECT ref, data FROM blobs WHERE ref IN ({marks})", chunk):
                found[ref] = decode_blob(data)
    except sqlite3.Error as exc:
        raise _failed(url, "read", exc) from exc
    return found


def _select_run_ids(conn: sqlite3.Connection, url: str) -> list[str]:
    try:
        # Served from the (run_id, pos) index: MIN(pos) per run is its first entry there.
        rows = conn.execute("SELECT run_id FROM events GROUP BY run_id ORDER BY MIN(pos)").fetchall()
    except sqlite3.Error as exc:
        raise _failed(url, "read", exc) from exc
    return [r for (r,) in rows]


def _close(conn: sqlite3.Connection) -> None:
    conn.close()


# -- find_cached's thread: its own read-only connection, opened on first use -----------------------------------------
_readers = threading.local()


def _find_cached(url: str, path: str, key: str, since: float) -> tuple[Any, ...] | None:
    conn: sqlite3.Connection | None = getattr(_readers, "conn", None)
    try:
        if conn is None:
            conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                   isolation_level=None)
            _readers.conn = conn
        row: tuple[Any, ...] | None = conn.execute(_FIND_CACHED, (key, since)).fetchone()
        return row
    except sqlite3.Error as exc:
        raise _failed(url, "read", exc) from exc


def _close_reader() -> None:
    conn = getattr(_readers, "conn", None)
    if conn is not None:
        conn.close()
        _readers.conn = None
