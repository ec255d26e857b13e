"""A fresh PostgreSQL schema per test for the workers' tests (``$PLANWEAVE_TEST_PG``, as tests/journal does)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

PG_DEFAULT = "postgresql://127.0.0.1:5432/test"


@dataclass
class Schema:
    """A journal URL on a schema of its own, and a side door to query what is stored there."""

    url: str
    name: str
    conn: psycopg.Connection[Any]

    def query(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(sql.SQL(text).format(s=sql.Identifier(self.name)), params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def pg_schema() -> Iterator[Schema]:
    base = os.environ.get("PLANWEAVE_TEST_PG", PG_DEFAULT)
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        if os.environ.get("PLANWEAVE_SKIP_PG") == "1":
            pytest.skip(f"PostgreSQL at {base} unreachable and PLANWEAVE_SKIP_PG=1: {exc}")
        pytest.fail(f"PostgreSQL at {base} is unreachable ({exc}); set PLANWEAVE_SKIP_PG=1 to skip these tests")
    name = f"pw_workers_{secrets.token_hex(5)}"
    separator = "&" if "?" in base else "?"
    try:
        yield Schema(f"{base}{separator}schema={name}", name, admin)
    finally:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        admin.close()
