"""Memory store backends for the conformance suite: the journal suite's backends (memory, SQLite in tmp_path,
PostgreSQL in a fresh schema at ``$PLANWEAVE_TEST_PG``), each test on empty storage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from planweave.memory import MemoryStore, open_memory_store
from tests.journal.conftest import Backend
from tests.journal.conftest import _make as make_backend

_ALL = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Clock:
    """The store's clock in tests: time moves only when a test says."""

    def __init__(self) -> None:
        self.now = 1796205146.25

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=_ALL)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(backend: Backend, clock: Clock) -> AsyncIterator[MemoryStore]:
    async with open_memory_store(backend.url, now=clock) as opened:
        yield opened
