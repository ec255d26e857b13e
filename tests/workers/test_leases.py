"""Leases and fencing on a real PostgreSQL journal, in one process: the queue's claims, renewals and the fence.

Two journals on one schema stand for two workers. The fence is checked where it matters: what is stored (read
over a separate connection), not what the writer believes.
"""

from __future__ import annotations

from typing import Any

import pytest

from planweave.core.errors import RunError
from planweave.core.events import Event
from planweave.journal.leases import Fence, LeaseStore, QueuedRun
from planweave.journal.postgres import PostgresJournal
from tests.workers.conftest import Schema

pytestmark = pytest.mark.postgres

PLAN: dict[str, Any] = {"steps": [{"id": "a", "tool": "echo", "args": {"value": 1}}]}


def queued(run_id: str) -> QueuedRun:
    return QueuedRun(run_id, PLAN, "test", {})


def expire(pg: Schema, run_id: str) -> None:
    pg.query("UPDATE {s}.planweave_leases SET expires_at = now() - interval '1 second' WHERE run_id = %s", (run_id,))


def stored(pg: Schema, run_id: str) -> list[tuple[str, int | None]]:
    return [(k, e) for k, e in pg.query(
        "SELECT kind, lease_epoch FROM {s}.planweave_events WHERE run_id = %s ORDER BY pos", (run_id,))]


async def test_a_holder_whose_lease_was_taken_over_cannot_append(pg_schema: Schema) -> None:
    a = await PostgresJournal.open(pg_schema.url)
    b = await PostgresJournal.open(pg_schema.url)
    store = await LeaseStore.open(pg_schema.url)
    refused: list[tuple[str, str, int]] = []
    try:
        fence_a = Fence("A", lambda run, epoch: refused.append(("A", run, epoch)))
        fence_b = Fence("B", lambda run, epoch: refused.append(("B", run, epoch)))
        await a.set_fence(fence_a, 5)
        await b.set_fence(fence_b, 5)
        await store.submit(queued("r1"))
        [claim_a] = await store.claim("A", 5, 30)
        fence_a.hold("r1", claim_a.epoch)
        a.append(Event("r1", "run_created", 1.0, None, {"by": "A"}))
        await a.flush()
        assert await store.claim("B", 5, 30) == []  # A's lease has not expired: nothing to claim

        expire(pg_schema, "r1")
        [claim_b] = await store.claim("B", 5, 30)
        assert (claim_b.epoch, claim_b.previous) == (claim_a.epoch + 1, "A")
        fence_b.hold("r1", claim_b.epoch)
        a.append(Event("r1", "step_started", 2.0, "a", {"by": "A, stale"}))
        await a.flush()  # the batch commits; the stale run's events are left out of it
        b.append(Event("r1", "run_resumed", 3.0, None, {"by": "B"}))
        await b.flush()

        assert stored(pg_schema, "r1") == [("run_created", 1), ("run_resumed", 2)]
        assert refused == [("A", "r1", 1)]
        assert fence_a.refused_events == 1 and "r1" not in fence_a.held
        assert await store.renew("A", {"r1": claim_a.epoch}, 30) == set()  # the renewal says so too
        assert await store.renew("B", {"r1": claim_b.epoch}, 30) == {"r1"}
    finally:
        for closable in (a, b, store):
            await closable.close()


async def test_a_fenced_journal_writes_only_runs_it_claimed_and_other_runs_in_the_batch_still_commit(
        pg_schema: Schema) -> None:
    journal = await PostgresJournal.open(pg_schema.url)
    store = await LeaseStore.open(pg_schema.url)
    refused: list[str] = []
    try:
        fence = Fence("A", lambda run, epoch: refused.append(run))
        await journal.set_fence(fence, 5)
        await store.submit(queued("mine"))
        [claim] = await store.claim("A", 1, 30)
        fence.hold("mine", claim.epoch)
        journal.append(Event("mine", "run_created", 1.0, None, {}))
        journal.append(Event("never-claimed", "run_created", 1.0, None, {}))
        await journal.flush()
        assert stored(pg_schema, "mine") == [("run_created", 1)]
        assert stored(pg_schema, "never-claimed") == []
        assert refused == ["never-claimed"]
    finally:
        await journal.close()
        await store.close()


async def test_claims_go_first_come_first_served_and_each_run_to_one_worker(pg_schema: Schema) -> None:
    journal = await PostgresJournal.open(pg_schema.url)  # creates the journal's tables
    store = await LeaseStore.open(pg_schema.url)
    try:
        for i in range(5):
            await store.submit(queued(f"r{i}"))
        with pytest.raises(RunError, match="already queued"):
            await store.submit(queued("r0"))
        first = await store.claim("A", 2, 30)
        second = await store.claim("B", 10, 30)
        assert [c.run_id for c in first] == ["r0", "r1"]
        assert [c.run_id for c in second] == ["r2", "r3", "r4"]
        assert {c.epoch for c in first + second} == {1}
        assert await store.finish(first[0], "B", "succeeded") is False  # not B's lease
        assert await store.finish(first[0], "A", "succeeded") is True
        await store.release(first[1:], "A")  # handed back: claimable again, by anyone, at the next epoch
        [again] = await store.claim("B", 10, 30)
        assert (again.run_id, again.epoch, again.previous) == ("r1", 2, None)
        views = {v.run_id: v for v in await store.leases()}
        assert views["r0"].state == "done" and views["r0"].outcome == "succeeded"
        assert views["r1"].holder == "B" and views["r1"].expires_in_s is not None
        claims = pg_schema.query("SELECT run_id, epoch, holder FROM {s}.planweave_lease_claims ORDER BY run_id, epoch")
        assert ("r1", 1, "A") in claims and ("r1", 2, "B") in claims
    finally:
        await journal.close()
        await store.close()


async def test_a_batch_is_queued_all_or_none(pg_schema: Schema) -> None:
    journal = await PostgresJournal.open(pg_schema.url)
    store = await LeaseStore.open(pg_schema.url)
    try:
        await store.submit(queued("a"), queued("b"))
        with pytest.raises(RunError, match="'b' is already queued"):
            await store.submit(queued("c"), queued("b"))
        with pytest.raises(RunError, match="'d' is given twice"):
            await store.submit(queued("d"), queued("d"))
        journal.append(Event("e", "run_created", 1.0, None, {}))
        await journal.flush()
        with pytest.raises(RunError, match="'e' is already in the journal"):
            await store.submit(queued("f"), queued("e"))
        assert [v.run_id for v in await store.leases()] == ["a", "b"]  # c and f were not queued either
    finally:
        await journal.close()
        await store.close()
