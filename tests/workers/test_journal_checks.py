"""The journal checks the process tests rely on find each kind of violation (so a green run means something)."""

from __future__ import annotations

import asyncio

import pytest

from planweave.journal.leases import LeaseStore
from planweave.journal.postgres import PostgresJournal
from tests.workers.conftest import Schema
from tests.workers.procs import journal_problems

pytestmark = pytest.mark.postgres


async def _tables(url: str) -> None:
    journal = await PostgresJournal.open(url)
    store = await LeaseStore.open(url)
    await store.close()
    await journal.close()


def write(pg: Schema, events: list[tuple[str, str | None, float, int]], claims: dict[int, float]) -> None:
    asyncio.run(_tables(pg.url))
    for epoch, at in claims.items():
        pg.query("INSERT INTO {s}.planweave_lease_claims (run_id, epoch, holder, claimed_at) "
                 "VALUES ('r', %s, 'w', to_timestamp(%s))", (epoch, at))
    for kind, step, at, epoch in events:
        pg.query("INSERT INTO {s}.planweave_events (run_id, at, kind, step, data, lease_epoch) "
                 "VALUES ('r', %s, %s, %s, '{{}}', %s)", (at, kind, step, epoch))


def test_a_clean_takeover_has_no_problems(pg_schema: Schema) -> None:
    write(pg_schema, [("step_started", "a", 1.0, 1), ("step_started", "a", 5.0, 2),
                      ("step_succeeded", "a", 6.0, 2)], {1: 0.5, 2: 4.0})
    assert journal_problems(pg_schema)[0] == []


@pytest.mark.parametrize(("events", "claims", "found"), [
    ([("step_started", "a", 1.0, 2), ("step_succeeded", "a", 2.0, 1)], {1: 0.0, 2: 0.5}, "written after epoch 2"),
    ([("step_started", "a", 1.0, 1), ("step_succeeded", "a", 2.0, 1), ("step_started", "a", 3.0, 2)],
     {1: 0.0, 2: 2.5}, "started again"),
    ([("step_started", "a", 1.0, 1), ("step_started", "a", 3.0, 2)], {1: 0.0, 2: 4.0}, "overlaps"),
    ([("step_started", "a", 1.0, 1), ("step_started", "a", 3.0, 2), ("step_succeeded", "a", 4.0, 1)],
     {1: 0.0, 2: 2.0}, "written after epoch 2"),
], ids=["stale-write", "finished-step-rerun", "overlap", "ended-by-the-old-holder"])
def test_each_violation_is_found(pg_schema: Schema, events: list[tuple[str, str | None, float, int]],
                                 claims: dict[int, float], found: str) -> None:
    write(pg_schema, events, claims)
    problems = journal_problems(pg_schema)[0]
    assert any(found in p for p in problems), problems
