"""The memory store in a SQLite journal's file: table ``memory_entries``, version in the journal's ``meta`` table
under ``memory_schema_version`` (the journal's own ``schema_version`` is not touched)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from planweave.journal.sqlite import path_of
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

__all__ = ["MEMORY_SCHEMA_VERSION", "SQLiteMemoryStore"]

T = TypeVar("T")
MEMORY_SCHEMA_VERSION = 1
_MIGRATIONS: dict[int, tuple[str, ...]] = {1: (
    """CREATE TABLE IF NOT EXISTS memory_entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
        status TEXT NOT NULL, text TEXT NOT NULL, body TEXT NOT NULL, run_id TEXT, step_ids TEXT NOT NULL,
        uses INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, note TEXT NOT NULL DEFAULT '',
        UNIQUE (kind, name, version))""",
    "CREATE INDEX IF NOT EXISTS memory_entries_status ON memory_entries (status)",
)}
_COLUMNS = "id, kind, name, version, status, text, body, run_id, step_ids, uses, created_at, note"


class SQLiteMemoryStore:
    """Entries in the SQLite file of a journal; each call runs on a worker thread under one lock."""

    def __init__(self, url: str, conn: sqlite3.Connection, now: Callable[[], float]) -> None:
        self.url = url
        self._conn = conn
        self._now = now
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, url: str, *, now: Callable[[], float] = time.time) -> SQLiteMemoryStore:
        path = path_of(url)
        conn = await asyncio.to_thread(_connect, url, path)
        return cls(url, conn, now)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        def locked() -> T:
            with self._lock:
                try:
                    return fn(self._conn, *args)
                except sqlite3.Error as exc:
                    raise MemoryStoreError(f"the memory store in {self.url} failed: {exc}") from exc
        return await asyncio.to_thread(locked)

    async def add(self, candidate: Candidate) -> MemoryEntry:
        checked(candidate)
        body = candidate.body()
        row = await self._call(_insert, candidate, json.dumps(body), self._now())
        return entry_from_row(row)

    async def get(self, entry_id: int) -> MemoryEntry:
        rows = await self._call(_select, "WHERE id = ?", (entry_id,))
        if not rows:
            raise unknown(entry_id, self.url)
        return entry_from_row(rows[0])

    async def entries(self, *, status: EntryStatus | None = None, kind: EntryKind | None = None) -> list[MemoryEntry]:
        where, params = _filter(status, kind)
        return [entry_from_row(r) for r in await self._call(_select, where, params)]

    async def set_status(self, entry_id: int, status: EntryStatus, note: str = "") -> MemoryEntry:
        await self.get(entry_id)
        await self._call(_set_status, entry_id, status, note)
        return await self.get(entry_id)

    async def record_use(self, entry_ids: Sequence[int]) -> None:
        for entry_id in entry_ids:
            await self.get(entry_id)
        await self._call(_record_use, list(dict.fromkeys(entry_ids)))

    async def close(self) -> None:
        await asyncio.to_thread(self._conn.close)


def _filter(status: str | None, kind: str | None) -> tuple[str, tuple[Any, ...]]:
    clauses, params = [], []
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if kind is not None:
        clauses.append("kind = ?")
        params.append(kind)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)


def _connect(url: str, path: str) -> sqlite3.Connection:
    try:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise MemoryStoreError(f"could not open the memory store in {url}: {exc}") from exc
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = conn.execute("SELECT value FROM meta WHERE key = 'memory_schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > MEMORY_SCHEMA_VERSION:
                raise MemoryStoreError(f"the memory store in {url} has schema version {version}, newer than this "
                                       f"planweave supports ({MEMORY_SCHEMA_VERSION}): upgrade planweave")
            for step in range(version + 1, MEMORY_SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('memory_schema_version', ?)",
                         (str(MEMORY_SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        conn.close()
        raise MemoryStoreError(f"could not open the memory store in {url}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _insert(conn: sqlite3.Connection, candidate: Candidate, body: str, now: float) -> tuple[Any, ...]:
    conn.execute("BEGIN IMMEDIATE")  # the next version of a name is read and written under the write lock
    try:
        (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM memory_entries WHERE kind = ? AND "
                                  "name = ?", (candidate.kind, candidate.name)).fetchone()
        cur = conn.execute(
            "INSERT INTO memory_entries (kind, name, version, status, text, body, run_id, step_ids, uses, "
            "created_at, note) VALUES (?, ?, ?, 'candidate', ?, ?, ?, ?, 0, ?, '')",
            (candidate.kind, candidate.name, version, candidate.text, body, candidate.run_id,
             json.dumps(list(candidate.step_ids)), now))
        row = conn.execute(f"SELECT {_COLUMNS} FROM memory_entries WHERE id = ?", (cur.lastrowid,)).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return tuple(row)


def _select(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM memory_entries {where} ORDER BY id", params)]


def _set_status(conn: sqlite3.Connection, entry_id: int, status: str, note: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        if status == "admitted":
            conn.execute(
                "UPDATE memory_entries SET status = 'retired', note = ? WHERE status = 'admitted' AND id != ? AND "
                "(kind, name) = (SELECT kind, name FROM memory_entries WHERE id = ?)",
                (f"superseded by entry {entry_id}", entry_id, entry_id))
        conn.execute("UPDATE memory_entries SET status = ?, note = ? WHERE id = ?", (status, note, entry_id))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _record_use(conn: sqlite3.Connection, entry_ids: list[int]) -> None:
    conn.executemany("UPDATE memory_entries SET uses = uses + 1 WHERE id = ?", [(i,) for i in entry_ids])
