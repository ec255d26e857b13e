"""A PostgreSQL journal (psycopg 3, async), with group commit; several processes may share one database.

URL: any libpq URI (``postgresql://user@host:5432/db?sslmode=...``) plus an optional ``schema=NAME`` query
parameter: the tables then live in that schema (created if missing), so tests or tenants can be kept apart.

``pos`` is global and, across processes, follows commit order: every batch takes a transaction-level advisory
lock before inserting, so a ``read(after=pos)`` that resumes from the last event it saw can never miss an event
that a slower process committed later with a smaller ``pos``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads

from planweave.core.errors import JournalError
from planweave.core.events import Event
from planweave.core.replies import REPLY_KINDS, standing_reply
from planweave.journal.base import CachedOutput, ReplyWritten, cache_entries, decode_blob, encode_data, encode_event
from planweave.journal.group_commit import GroupCommitJournal, event_filter, run_filter, run_page
from planweave.journal.summary import BatchRun, PruneResult, RunPage, RunQuery, RunSummary
from planweave.journal.urls import redact_url as redact  # the URL shown in messages (kept under its old name)

if TYPE_CHECKING:
    from planweave.journal.leases import Fence

__all__ = ["SCHEMA_VERSION", "PostgresJournal", "parse_url"]

#: Version of the tables below, kept in ``planweave_meta``; bump it and add a migration when they change.
SCHEMA_VERSION = 3
#: Seconds to wait for the server when connecting, unless the URL sets ``connect_timeout``.
CONNECT_TIMEOUT_S = 10
# Advisory lock keys (two int4s: a planweave constant, then a per-schema or per-purpose key).
_LOCK_CLASS = 0x706C_7776  # "plwv"
_DDL_KEY = 0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS planweave_events (
        pos BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        step TEXT,
        data JSONB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS planweave_events_run ON planweave_events (run_id, pos)",
    # BYTEA, not JSONB: the canonical bytes are kept exactly (their hash is the ref) and need no parsing.
    "CREATE TABLE IF NOT EXISTS planweave_blobs (ref TEXT PRIMARY KEY, data BYTEA NOT NULL)",
)
# Version 2: one summary row per run (planweave.journal.summary), written in the batch that changes it (see the
# SQLite journal for the columns). Runs journaled before it start stale: the first listing folds each once.
_RUNS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS planweave_runs (
        run_id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        pos BIGINT NOT NULL,
        status TEXT NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        stale SMALLINT NOT NULL,
        owner JSONB,
        source TEXT,
        summary JSONB
    )""",
    "CREATE INDEX IF NOT EXISTS planweave_runs_seq ON planweave_runs (seq)",
    "CREATE INDEX IF NOT EXISTS planweave_runs_status ON planweave_runs (status, seq)",
    "CREATE INDEX IF NOT EXISTS planweave_runs_stale ON planweave_runs (stale) WHERE stale = 1",
    "INSERT INTO planweave_runs (run_id, seq, pos, status, stale) SELECT run_id, min(pos), max(pos), 'running', 1 "
    "FROM planweave_events GROUP BY run_id ON CONFLICT (run_id) DO NOTHING",
)
# Version 3: the result cache's index (see the SQLite journal): written in the batch of its step_succeeded event,
# deleted with its run by prune; older journals are indexed from their events.
_CACHE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS planweave_cache (
        id BIGSERIAL PRIMARY KEY,
        key TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        output TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS planweave_cache_key ON planweave_cache (key, at)",
    "CREATE INDEX IF NOT EXISTS planweave_cache_run ON planweave_cache (run_id)",
    "INSERT INTO planweave_cache (key, at, run_id, step, output) SELECT data->>'cache_key', at, run_id, step, "
    "data->>'output' FROM planweave_events WHERE kind = 'step_succeeded' AND step IS NOT NULL "
    "AND jsonb_typeof(data->'cache_key') = 'string' AND jsonb_typeof(data->'output') = 'string' "
    "AND NOT data ? 'cache' AND NOT EXISTS (SELECT 1 FROM planweave_cache) ORDER BY pos",
)
#: The statements that take the tables from version ``n - 1`` to ``n``.
_MIGRATIONS: dict[int, tuple[str, ...]] = {1: _SCHEMA, 2: _RUNS_SCHEMA, 3: _CACHE_SCHEMA}
_INSERT_CACHE = ("INSERT INTO planweave_cache (key, at, run_id, step, output) "
                 "SELECT * FROM unnest(%s::text[], %s::float8[], %s::text[], %s::text[], %s::text[])")
_FIND_CACHED = ("SELECT c.run_id, c.step, c.at, c.output, b.data FROM planweave_cache c "
                "JOIN planweave_blobs b ON b.ref = c.output WHERE c.key = %s AND c.at >= %s "
                "ORDER BY c.at DESC, c.id DESC LIMIT 1")
# A batch's summaries: one statement each for the fresh and the stale ones; seq and pos come from the events just
# written (their (run_id, pos) index answers min and max at once).
_UPSERT_SUMMARIES = """INSERT INTO planweave_runs AS r
    (run_id, seq, pos, status, started_at, finished_at, stale, owner, source, summary)
    SELECT u.run_id, b.seq, b.pos, u.status, u.started_at, u.finished_at, 0, u.owner::jsonb, u.source, u.summary::jsonb
    FROM unnest(%s::text[], %s::text[], %s::float8[], %s::float8[], %s::text[], %s::text[], %s::text[])
        AS u(run_id, status, started_at, finished_at, owner, source, summary)
    CROSS JOIN LATERAL (SELECT min(pos) AS seq, max(pos) AS pos FROM planweave_events e WHERE e.run_id = u.run_id) b
    ON CONFLICT (run_id) DO UPDATE SET pos = EXCLUDED.pos, status = EXCLUDED.status,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at, stale = 0,
        owner = COALESCE(EXCLUDED.owner, r.owner), source = COALESCE(EXCLUDED.source, r.source),
        summary = EXCLUDED.summary"""
_MARK_STALE = """INSERT INTO planweave_runs AS r (run_id, seq, pos, status, stale, owner, source)
    SELECT u.run_id, b.seq, b.pos, 'running', 1, u.owner::jsonb, u.source
    FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(run_id, owner, source)
    CROSS JOIN LATERAL (SELECT min(pos) AS seq, max(pos) AS pos FROM planweave_events e WHERE e.run_id = u.run_id) b
    ON CONFLICT (run_id) DO UPDATE SET pos = EXCLUDED.pos, stale = 1, owner = COALESCE(EXCLUDED.owner, r.owner),
        source = COALESCE(EXCLUDED.source, r.source)"""
_STORE_FOLDED = """UPDATE planweave_runs SET status = %s, started_at = %s, finished_at = %s, owner = %s::jsonb,
    source = %s, summary = %s::jsonb, stale = 0 WHERE run_id = %s AND stale = 1 AND pos <= %s"""
_RUN_COLUMNS = "run_id, seq, status, started_at, finished_at, owner, source, summary"
_COPY_EVENTS = "COPY planweave_events (run_id, at, kind, step, data) FROM STDIN"
# One statement for the whole batch (arrays as parameters): one round trip however many outputs there are.
_INSERT_BLOBS = (
    "INSERT INTO planweave_blobs (ref, data) SELECT * FROM unnest(%s::text[], %s::bytea[]) ON CONFLICT (ref) DO NOTHING"
)
_COLUMNS = "pos, run_id, at, kind, step, data"


def parse_url(url: str) -> tuple[str, str | None, str]:
    """Split a journal URL into libpq conninfo, the ``schema`` parameter and a password-free URL for messages."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = None
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if schema == "":
        raise JournalError(f"journal URL '{redact(url)}' has an empty schema parameter")
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment))
    return conninfo, schema, redact(url)


class PostgresJournal(GroupCommitJournal):
    """A durable journal in PostgreSQL; open it with :meth:`open` (or :func:`planweave.journal.open_journal`).

    One connection carries the writer's batches and the reads; a lock keeps a read from running inside a
    batch's transaction (an error there would abort the batch). ``url`` is the URL without its password.
    """

    def __init__(self, url: str, conn: psycopg.AsyncConnection[Any], schema: str | None,
                 connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None) -> None:
        super().__init__(url)
        self.schema = schema
        self._conn = conn
        self._lock = asyncio.Lock()
        # find_cached's own connection (opened by ``connect`` on first use): a lookup never waits for a batch's
        # commit on the writer's connection. Without ``connect``, lookups share that connection.
        self._connect_reader = connect
        self._reader: psycopg.AsyncConnection[Any] | None = None
        self._reader_lock = asyncio.Lock()
        #: The leases this journal's writer must still hold to write a run's events (a worker's; see leases.py).
        self.fence: Fence | None = None

    @classmethod
    async def open(cls, url: str) -> PostgresJournal:
        """Connect to ``url`` and create the schema and tables if missing; raises JournalError if that fails."""
        conninfo, schema, safe_url = parse_url(url)
        options: dict[str, Any] = {}
        if "connect_timeout" not in conninfo:
            options["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            # autocommit: reads need no transaction; each batch opens its own with conn.transaction().
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **options)
        except psycopg.Error as exc:
            raise JournalError(f"could not connect to the journal {safe_url}: {exc}") from exc
        try:
            await _prepare(conn, schema, safe_url)
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.Error):
                raise JournalError(f"could not set up the journal {safe_url}: {exc}") from exc
            raise
        set_json_loads(decode_blob, conn)  # exact for integers beyond 64 bits too

        async def connect_reader() -> psycopg.AsyncConnection[Any]:
            reader = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **options)
            if schema is not None:
                await reader.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            return reader

        journal = cls(safe_url, conn, schema, connect_reader)
        journal._start()
        return journal

    async def set_fence(self, fence: Fence, idle_timeout_s: float) -> None:
        """Write only the events of runs whose lease ``fence`` still holds (checked in each batch's transaction).

        A transaction left open longer than ``idle_timeout_s`` (this process was paused mid-batch) is ended by the
        server, so it cannot hold the lease rows, and every other writer, for longer than that.
        """
        ms = max(1, int(idle_timeout_s * 1000))
        async with self._lock:
            await self._conn.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        self.fence = fence

    def _encode(self, event: Event) -> bytes:
        data = encode_event(event, self.url)
        if b"\\u0000" in data:
            # JSONB cannot hold NUL characters (e.g. in a tool's error text): store U+FFFD in their place rather
            # than refuse the event.
            data = encode_data(_without_nul(event.data))
        return data

    async def _write(self, events: list[tuple[Event, bytes]], blobs: dict[str, bytes], runs: list[BatchRun]) -> None:
        rows = [(e.run_id, e.at, e.kind, e.step, data.decode()) for e, data in events]
        try:
            async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
                # Serialise batches of all processes on this schema, so pos order is commit order (module doc).
                await cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK_CLASS,))
                copy_events = _COPY_EVENTS
                if self.fence is not None:  # refuse the events of runs whose lease moved on; stamp the epoch
                    rows, copy_events = await self.fence.admit(cur, rows), self.fence.copy_events
                if blobs:
                    await cur.execute(_INSERT_BLOBS, (list(blobs), list(blobs.values())))
                if rows:
                    async with cur.copy(copy_events) as copy:
                        for row in rows:
                            await copy.write_row(row)
                    written = {row[0] for row in rows}
                    if runs:
                        await _write_summaries(cur, runs, written)
                    cache = [(k, e) for k, e in cache_entries(events) if e.run_id in written]
                    if cache:
                        await cur.execute(_INSERT_CACHE, tuple(map(list, zip(
                            *((k, e.at, e.run_id, e.step, e.output) for k, e in cache), strict=True))))
        except psycopg.Error as exc:
            raise JournalError(f"could not write to the journal {self.url}: {exc}") from exc

    async def _append_reply(self, event: Event, data: bytes) -> ReplyWritten:
        try:
            async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
                # The writers' lock first (every batch of every process takes it): nothing is written between the
                # check and the insert, neither another reply nor the run's own decision.
                await cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK_CLASS,))
                await cur.execute(f"SELECT {_COLUMNS} FROM planweave_events WHERE run_id = %s AND step = %s "
                                  "AND kind = ANY(%s) ORDER BY pos", (event.run_id, event.step, list(REPLY_KINDS)))
                standing = standing_reply(Event(r, k, a, s, d, p)
                                          for p, r, a, k, s, d in await cur.fetchall())
                if standing is not None:
                    return ReplyWritten(False, standing)
                await cur.execute("INSERT INTO planweave_events (run_id, at, kind, step, data) "
                                  "VALUES (%s, %s, %s, %s, %s::jsonb) RETURNING pos",
                                  (event.run_id, event.at, event.kind, event.step, data.decode()))
                row = await cur.fetchone()
                assert row is not None  # INSERT ... RETURNING answers its row
                await cur.execute(_MARK_STALE, ([event.run_id], [None], [None]))  # another writer's event: fold it
        except psycopg.Error as exc:
            raise JournalError(f"could not write to the journal {self.url}: {exc}") from exc
        return ReplyWritten(True, event._replace(pos=int(row[0])))

    async def _select(self, run_id: str | None, after: int, kind: str | None, limit: int | None) -> list[Event]:
        where, params = event_filter(run_id, after, kind, "%s")
        page = "" if limit is None else f" LIMIT {int(limit)}"
        query = f"SELECT {_COLUMNS} FROM planweave_events WHERE {where} ORDER BY pos{page}"
        rows = await self._fetch(query, tuple(params))
        return [Event(r, k, a, s, d, p) for p, r, a, k, s, d in rows]

    async def _select_blobs(self, refs: list[str]) -> dict[str, Any]:
        rows = await self._fetch("SELECT ref, data FROM planweave_blobs WHERE ref = ANY(%s)", (refs,))
        return {ref: decode_blob(data) for ref, data in rows}

    async def _select_run_ids(self) -> list[str]:
        rows = await self._fetch("SELECT run_id FROM planweave_events GROUP BY run_id ORDER BY min(pos)", ())
        return [r for (r,) in rows]

    async def _select_runs(self, query: RunQuery) -> RunPage:
        where, params = run_filter(query, "%s")
        limit = "" if query.limit is None else f" LIMIT {int(query.limit) + 1}"
        ((position,),) = await self._fetch("SELECT coalesce(max(pos), 0) FROM planweave_events", ())  # first
        rows = await self._fetch(f"SELECT {_RUN_COLUMNS} FROM planweave_runs{where} ORDER BY seq DESC{limit}",
                                 tuple(params))
        return run_page(rows, query, int(position))

    async def _select_stale(self) -> list[tuple[str, int]]:
        rows = await self._fetch("SELECT run_id, seq FROM planweave_runs WHERE stale = 1 ORDER BY seq", ())
        return [(r, int(q)) for r, q in rows]

    async def _store_summaries(self, summaries: list[tuple[RunSummary, int]]) -> None:
        rows = [(s.status, s.started_at, s.finished_at, orjson.dumps(dict(s.owner)).decode(), s.source,
                 orjson.dumps(s.document()).decode(), s.run_id, pos) for s, pos in summaries]
        if not rows:
            return
        try:
            async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
                await cur.executemany(_STORE_FOLDED, rows)
        except psycopg.Error as exc:
            raise JournalError(f"could not write to the journal {self.url}: {exc}") from exc

    async def _delete_runs(self, finished_before: float, statuses: frozenset[str]) -> PruneResult:
        try:
            async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
                # The writers' lock: no batch (a resume's run_resumed) lands between the check and the delete.
                await cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK_CLASS,))
                await cur.execute(
                    "SELECT run_id FROM planweave_runs WHERE stale = 0 AND status = ANY(%s) AND finished_at < %s "
                    "ORDER BY seq", (sorted(statuses), finished_before))
                doomed = [r for (r,) in await cur.fetchall()]
                if not doomed:
                    return PruneResult([], 0, 0, 0)
                await cur.execute("SELECT count(*), coalesce(sum(octet_length(data::text)), 0) FROM planweave_events "
                                  "WHERE run_id = ANY(%s)", (doomed,))
                events, freed = await _one(cur)
                await cur.execute("SELECT DISTINCT data->>'output' FROM planweave_events WHERE run_id = ANY(%s) "
                                  "AND kind = 'step_succeeded'", (doomed,))
                refs = {r for (r,) in await cur.fetchall() if isinstance(r, str)}
                await cur.execute("DELETE FROM planweave_events WHERE run_id = ANY(%s)", (doomed,))
                await cur.execute("DELETE FROM planweave_runs WHERE run_id = ANY(%s)", (doomed,))
                await cur.execute("DELETE FROM planweave_cache WHERE run_id = ANY(%s)", (doomed,))
                await cur.execute("SELECT DISTINCT data->>'output' FROM planweave_events WHERE kind = 'step_succeeded' "
                                  "AND data->>'output' = ANY(%s)", (sorted(refs),))
                gone = sorted(refs - {r for (r,) in await cur.fetchall()})
                await cur.execute("SELECT count(*), coalesce(sum(octet_length(data)), 0) FROM planweave_blobs "
                                  "WHERE ref = ANY(%s)", (gone,))
                outputs, blob_bytes = await _one(cur)
                await cur.execute("DELETE FROM planweave_blobs WHERE ref = ANY(%s)", (gone,))
        except psycopg.Error as exc:
            raise JournalError(f"could not prune the journal {self.url}: {exc}") from exc
        return PruneResult(doomed, events, outputs, freed + blob_bytes)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        """The newest output indexed under ``key`` produced at or after ``since`` (what is committed)."""
        if self._released:
            raise JournalError(f"the journal {self.url} is closed")
        if self._connect_reader is None:
            rows = await self._fetch(_FIND_CACHED, (key, since))
        else:
            try:
                async with self._reader_lock:
                    if self._reader is None or self._reader.closed:
                        self._reader = await self._connect_reader()
                    cur = await self._reader.execute(_FIND_CACHED, (key, since))
                    rows = await cur.fetchall()
            except psycopg.Error as exc:
                raise JournalError(f"could not read the journal {self.url}: {exc}") from exc
        if not rows:
            return None
        run_id, step, at, output, data = rows[0]
        return CachedOutput(run_id, step, float(at), output, decode_blob(data))

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            async with self._lock, self._conn.cursor() as cur:
                await cur.execute(query, params)
                return await cur.fetchall()
        except psycopg.Error as exc:
            raise JournalError(f"could not read the journal {self.url}: {exc}") from exc

    async def _release(self) -> None:
        try:
            await self._conn.close()
        finally:
            if self._reader is not None:
                await self._reader.close()


async def _prepare(conn: psycopg.AsyncConnection[Any], schema: str | None, safe_url: str) -> None:
    # A durable journal must not depend on the server's default: commits wait for the WAL flush.
    await conn.execute("SET synchronous_commit = on")
    async with conn.transaction():
        # CREATE ... IF NOT EXISTS is not safe against a concurrent identical CREATE (unique violation on
        # the catalog): processes opening the same new database take turns here.
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, _DDL_KEY))
        if schema is not None:
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            # A plain (not LOCAL) SET outlives the transaction: the session keeps using this schema.
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        await conn.execute("CREATE TABLE IF NOT EXISTS planweave_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        cur = await conn.execute("SELECT value FROM planweave_meta WHERE key = 'schema_version'")
        row = await cur.fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"the journal {safe_url} has schema version {version}, newer than this planweave supports "
                f"({SCHEMA_VERSION}): upgrade planweave"
            )
        if version < SCHEMA_VERSION:  # 0: new tables
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    await conn.execute(statement)
            await conn.execute(
                "INSERT INTO planweave_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(SCHEMA_VERSION),),
            )


async def _write_summaries(cur: psycopg.AsyncCursor[Any], runs: list[BatchRun], written: set[str]) -> None:
    """Upsert the summaries of the runs a batch wrote events of (``written``: a fence may have refused some)."""
    fresh = [r for r in runs if r.summary is not None and r.run_id in written]
    stale = [r for r in runs if r.summary is None and r.run_id in written]

    def owner(run: BatchRun) -> str | None:
        return orjson.dumps(run.owner).decode() if run.owner is not None else None

    if fresh:
        summaries = [r.summary for r in fresh if r.summary is not None]
        await cur.execute(_UPSERT_SUMMARIES, (
            [r.run_id for r in fresh], [s.status for s in summaries], [s.started_at for s in summaries],
            [s.finished_at for s in summaries], [owner(r) for r in fresh], [r.source for r in fresh],
            [orjson.dumps(s.document()).decode() for s in summaries]))
    if stale:
        await cur.execute(_MARK_STALE, ([r.run_id for r in stale], [owner(r) for r in stale],
                                        [r.source for r in stale]))


async def _one(cur: psycopg.AsyncCursor[Any]) -> tuple[int, int]:
    row = await cur.fetchone()
    assert row is not None  # an aggregate always answers one row
    return int(row[0]), int(row[1])


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, Mapping):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value
