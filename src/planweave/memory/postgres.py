"""The memory store in a PostgreSQL journal's schema: table ``planweave_memory``, version in ``planweave_meta``
under ``memory_schema_version`` (the journal's own ``schema_version`` is not touched)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from planweave.journal.postgres import parse_url
from planweave.memory.model import (
    Candidate,
    EntryKind,
    EntryStatus,
    MemoryEntry,
    MemoryStoreError,
    checked,
    entry_from_row,
    unknown,
)

__all__ = ["MEMORY_SCHEMA_VERSION", "PostgresMemoryStore"]

MEMORY_SCHEMA_VERSION = 1
_LOCK_KEY = 0x6D656D  # "mem": the advisory lock DDL and version assignment take turns under
_MIGRATIONS: dict[int, tuple[str, ...]] = {1: (
    """CREATE TABLE IF NOT EXISTS planweave_memory (
        id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
        status TEXT NOT NULL, text TEXT NOT NULL, body JSONB NOT NULL, run_id TEXT, step_ids JSONB NOT NULL,
        uses INTEGER NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL, note TEXT NOT NULL DEFAULT '',
        UNIQUE (kind, name, version))""",
    "CREATE INDEX IF NOT EXISTS planweave_memory_status ON planweave_memory (status)",
)}
_COLUMNS = "id, kind, name, version, status, text, body, run_id, step_ids, uses, created_at, note"


class PostgresMemoryStore:
    """Entries in the PostgreSQL database (and ``schema``) of a journal URL; one connection, one call at a time."""

    def __init__(self, url: str, conn: psycopg.AsyncConnection[Any], now: Callable[[], float]) -> None:
        self.url = url
        self._conn = conn
        self._now = now
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, *, now: Callable[[], float] = time.time) -> PostgresMemoryStore:
        conninfo, schema, safe_url = parse_url(url)
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise MemoryStoreError(f"could not connect to the memory store in {safe_url}: {exc}") from exc
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                if schema is not None:
                    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
                    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                await conn.execute("CREATE TABLE IF NOT EXISTS planweave_meta (key TEXT PRIMARY KEY, value TEXT "
                                   "NOT NULL)")
                cur = await conn.execute("SELECT value FROM planweave_meta WHERE key = 'memory_schema_version'")
                row = await cur.fetchone()
                version = int(row[0]) if row else 0
                if version > MEMORY_SCHEMA_VERSION:
                    raise MemoryStoreError(f"the memory store in {safe_url} has schema version {version}, newer "
                                           f"than this planweave supports ({MEMORY_SCHEMA_VERSION})")
                for step in range(version + 1, MEMORY_SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[step]:
                        await conn.execute(statement)
                await conn.execute("INSERT INTO planweave_meta (key, value) VALUES ('memory_schema_version', %s) "
                                   "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                                   (str(MEMORY_SCHEMA_VERSION),))
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.Error):
                raise MemoryStoreError(f"could not set up the memory store in {safe_url}: {exc}") from exc
            raise
        return cls(safe_url, conn, now)

    async def _fetch(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._lock:
            try:
                cur = await self._conn.execute(query, params)
                return list(await cur.fetchall()) if cur.description else []
            except psycopg.Error as exc:
                raise MemoryStoreError(f"the memory store in {self.url} failed: {exc}") from exc

    async def add(self, candidate: Candidate) -> MemoryEntry:
        checked(candidate)
        body = candidate.body()
        async with self._lock:
            try:
                async with self._conn.transaction():
                    await self._conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                                             (_LOCK_KEY, f"{candidate.kind}:{candidate.name}"))
                    cur = await self._conn.execute(
                        "INSERT INTO planweave_memory (kind, name, version, status, text, body, run_id, step_ids, "
                        "uses, created_at, note) SELECT %s, %s, COALESCE(MAX(version), 0) + 1, 'candidate', %s, "
                        "%s::jsonb, %s, %s::jsonb, 0, %s, '' FROM planweave_memory WHERE kind = %s AND name = %s "
                        f"RETURNING {_COLUMNS}",
                        (candidate.kind, candidate.name, candidate.text, json.dumps(body), candidate.run_id,
                         json.dumps(list(candidate.step_ids)), self._now(), candidate.kind, candidate.name))
                    row = await cur.fetchone()
            except psycopg.Error as exc:
                raise MemoryStoreError(f"the memory store in {self.url} failed: {exc}") from exc
        assert row is not None
        return entry_from_row(row)

    async def get(self, entry_id: int) -> MemoryEntry:
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM planweave_memory WHERE id = %s", (entry_id,))
        if not rows:
            raise unknown(entry_id, self.url)
        return entry_from_row(rows[0])

    async def entries(self, *, status: EntryStatus | None = None, kind: EntryKind | None = None) -> list[MemoryEntry]:
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM planweave_memory WHERE (%s::text IS NULL OR status = %s) AND "
            "(%s::text IS NULL OR kind = %s) ORDER BY id", (status, status, kind, kind))
        return [entry_from_row(r) for r in rows]

    async def set_status(self, entry_id: int, status: EntryStatus, note: str = "") -> MemoryEntry:
        entry = await self.get(entry_id)
        async with self._lock:
            try:
                async with self._conn.transaction():
                    if status == "admitted":
                        await self._conn.execute(
                            "UPDATE planweave_memory SET status = 'retired', note = %s WHERE status = 'admitted' "
                            "AND id != %s AND kind = %s AND name = %s",
                            (f"superseded by entry {entry_id}", entry_id, entry.kind, entry.name))
                    await self._conn.execute("UPDATE planweave_memory SET status = %s, note = %s WHERE id = %s",
                                             (status, note, entry_id))
            except psycopg.Error as exc:
                raise MemoryStoreError(f"the memory store in {self.url} failed: {exc}") from exc
        return await self.get(entry_id)

    async def record_use(self, entry_ids: Sequence[int]) -> None:
        for entry_id in entry_ids:
            await self.get(entry_id)
        await self._fetch("UPDATE planweave_memory SET uses = uses + 1 WHERE id = ANY(%s)", (list(entry_ids),))

    async def close(self) -> None:
        await self._conn.close()
