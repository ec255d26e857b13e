"""Integers the API takes from clients (``cursor``, ``Last-Event-ID``): out of range, negative or not a number,
each is a 422 naming the parameter, on SQLite and PostgreSQL journals alike; the largest position still works."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.journal.conftest import _make as make_backend

from .conftest import Live, chain_plan, start_live

HUGE = "99999999999999999999999999"
BAD = [HUGE, str(2**63), "-1", "abc", "1.5"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    for backend in make_backend(request.param, tmp_path):
        yield backend.url


@pytest.fixture
async def served(journal: str) -> AsyncIterator[Live]:
    async with start_live(journal) as live:
        yield live


def fields(body: dict[str, Any]) -> list[str]:
    return [p["field"] for p in body["problems"]]


@pytest.mark.parametrize("value", BAD)
async def test_a_cursor_out_of_range_or_not_a_position_is_a_422_naming_it(served: Live, value: str) -> None:
    async with served.client() as client:
        answer = await client.get("/runs", params={"cursor": value})
    assert answer.status_code == 422, answer.text
    assert fields(answer.json()) == ["query.cursor"]


@pytest.mark.parametrize("value", BAD)
async def test_a_last_event_id_out_of_range_or_not_a_position_is_a_422_naming_it(served: Live, value: str) -> None:
    async with served.client() as client:
        accepted = await client.post("/runs", json={"plan": chain_plan(1, 0)})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        await served.wait(run_id)
        for path in ("/events", f"/runs/{run_id}/events"):
            answer = await client.get(path, headers={"Last-Event-ID": value})
            assert answer.status_code == 422, (path, answer.text)
            assert fields(answer.json()) == ["header.Last-Event-ID"], path


async def test_the_largest_position_is_still_a_valid_cursor(served: Live) -> None:
    async with served.client() as client:
        answer = await client.get("/runs", params={"cursor": str(2**63 - 1)})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("value", [HUGE, "-1", "abc"])
async def test_a_memory_entry_id_out_of_range_is_a_422_naming_it(served: Live, value: str) -> None:
    async with served.client() as client:
        answer = await client.get(f"/memory/{value}")
    assert answer.status_code == 422, answer.text
    assert fields(answer.json()) == ["path.entry_id"]
