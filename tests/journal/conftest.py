"""Journal backends for the conformance suite: memory, SQLite (in tmp_path) and PostgreSQL (in a fresh schema).

The PostgreSQL server is at ``$PLANWEAVE_TEST_PG`` (default ``postgresql://127.0.0.1:5432/test``). If it cannot
be reached its tests FAIL, so a broken CI database is noticed; set ``PLANWEAVE_SKIP_PG=1`` to skip them instead.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

PG_DEFAULT = "postgresql://127.0.0.1:5432/test"

# Logical table name -> (SQLite table, PostgreSQL table).
_TABLES = {"events": ("events", "planweave_events"), "blobs": ("blobs", "planweave_blobs"),
           "cache": ("cache", "planweave_cache")}


@dataclass
class Backend:
    """A journal URL to test, and a side door into its storage (None for memory) to check what was stored."""

    name: str
    url: str
    execute: Callable[[str], list[tuple[object, ...]]] | None = None
    table: Callable[[str], str] = lambda logical: logical

    @property
    def durable(self) -> bool:
        return self.execute is not None

    def count(self, logical_table: str) -> int:
        """Rows in ``events`` or ``blobs``, read over a separate connection (i.e. what is really stored)."""
        assert self.execute is not None, f"{self.name} has no storage to inspect"
        ((n,),) = self.execute(f"SELECT count(*) FROM {self.table(logical_table)}")
        assert isinstance(n, int)
        return n


def _sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "journal" / "runs.db"

    def execute(query: str) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(path, timeout=30)
        try:
            with conn:
                return conn.execute(query).fetchall()
        finally:
            conn.close()

    return Backend("sqlite", f"sqlite:///{path}", execute, lambda t: _TABLES[t][0])


def _postgres_backend() -> Iterator[Backend]:
    base = os.environ.get("PLANWEAVE_TEST_PG", PG_DEFAULT)
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        if os.environ.get("PLANWEAVE_SKIP_PG") == "1":
            pytest.skip(f"PostgreSQL at {base} unreachable and PLANWEAVE_SKIP_PG=1: {exc}")
        pytest.fail(f"PostgreSQL at {base} is unreachable ({exc}); set PLANWEAVE_SKIP_PG=1 to skip these tests")
    schema = f"pw_test_{secrets.token_hex(6)}"

    def execute(query: str) -> list[tuple[object, ...]]:
        cur = admin.execute(query)
        return cur.fetchall() if cur.description else []

    separator = "&" if "?" in base else "?"
    try:
        yield Backend("postgres", f"{base}{separator}schema={schema}", execute, lambda t: f"{schema}.{_TABLES[t][1]}")
    finally:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        admin.close()


_ALL = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
_DURABLE = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _make(name: str, tmp_path: Path) -> Iterator[Backend]:
    if name == "memory":
        yield Backend("memory", "memory://")
    elif name == "sqlite":
        yield _sqlite_backend(tmp_path)
    else:
        yield from _postgres_backend()


@pytest.fixture(params=_ALL)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Every journal implementation, each test on empty storage."""
    yield from _make(request.param, tmp_path)


@pytest.fixture(params=_DURABLE)
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The durable journal implementations (SQLite, PostgreSQL), each test on empty storage."""
    yield from _make(request.param, tmp_path)


@pytest.fixture
def pg_backend() -> Iterator[Backend]:
    """PostgreSQL alone, in a fresh schema (mark the test ``postgres``)."""
    yield from _postgres_backend()
