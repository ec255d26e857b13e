"""A worker paused (SIGSTOP) past its lease cannot write into the run another worker took over, once it wakes.

Worker A claims the run and starts its first step, which waits at a gate. A is stopped; its lease expires and
worker B takes the run over and resumes it. A renews only every 30 s, so when it is continued its renewal has not
noticed the loss: the only thing between its step's result and the journal is the fence. The gate opens, B finishes
the run, and then A is continued: its step returns and A appends the step's success. The journal must refuse it (A's
log says so) and hold nothing of A's epoch after B's.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from planweave.journal.leases import LeaseStore, QueuedRun
from planweave.journal.postgres import PostgresJournal
from tests.workers.conftest import Schema
from tests.workers.procs import done, journal_problems, start_worker, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def submit(url: str, gate: Path) -> None:
    journal = await PostgresJournal.open(url)
    store = await LeaseStore.open(url)
    plan = {"steps": [{"id": "hold", "tool": "wait_for", "args": {"gate": str(gate), "value": 1}},
                      {"id": "after", "tool": "pause", "args": {"seconds": 0.01}, "after": ["hold"]}]}
    try:
        await store.submit(QueuedRun("paused", plan, "test", {}))
    finally:
        await store.close()
        await journal.close()


def started_under(pg: Schema, epoch: int) -> bool:
    return bool(pg.query("SELECT 1 FROM {s}.planweave_events WHERE kind = 'step_started' AND step = 'hold' "
                         "AND lease_epoch = %s", (epoch,)))


def test_a_paused_worker_that_lost_its_lease_cannot_write(pg_schema: Schema, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    asyncio.run(submit(pg_schema.url, gate))
    a = start_worker(pg_schema.url, "A", tmp_path, "--lease", "2", "--renew-every", "30")
    b = None
    try:
        wait_until("A running the first step", lambda: started_under(pg_schema, 1), timeout=60)
        a.signal(signal.SIGSTOP)
        b = start_worker(pg_schema.url, "B", tmp_path, "--lease", "2")
        wait_until("B running the first step again", lambda: started_under(pg_schema, 2), timeout=60)
        gate.touch()
        wait_until("B finishing the run", lambda: done(pg_schema) == 1, timeout=60)
        a.signal(signal.SIGCONT)
        wait_until("A's write refused (or, if the fence failed, stored)", lambda: "journal refused its events" in
                   a.text() or bool(pg_schema.query("SELECT 1 FROM {s}.planweave_events WHERE lease_epoch = 1 AND "
                                                    "kind = 'step_succeeded'")), timeout=60)
    finally:
        codes = {"A": a.stop(), **({"B": b.stop()} if b is not None else {})}
    assert codes == {"A": 0, "B": 0}, (codes, a.text(), b.text() if b else "")
    assert "journal refused its events" in a.text() and "'refused_events': 0" not in a.text(), a.text()

    problems, attempts = journal_problems(pg_schema)
    assert problems == [], problems
    [first, second] = attempts["paused/hold"]
    assert (first.epoch, first.end, second.epoch, second.outcome) == (1, None, 2, "step_succeeded")
    epochs = pg_schema.query("SELECT DISTINCT lease_epoch FROM {s}.planweave_events WHERE pos > "
                             "(SELECT min(pos) FROM {s}.planweave_events WHERE lease_epoch = 2)")
    assert epochs == [(2,)]
    assert pg_schema.query("SELECT state, outcome, holder, epoch FROM {s}.planweave_leases") == [
        ("done", "succeeded", "B", 2)]
