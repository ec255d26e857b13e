"""An approval and a cancellation given with the CLI reach runs on a worker, also after another worker took them over.

Worker A starts two runs: one waits for an approval, one waits at a gate that never opens. A is SIGKILLed and
worker B takes both over. Then ``planweave approve`` and ``planweave cancel`` are run from another process: B
applies them (through the journal), so the first run succeeds and the second ends cancelled, both recorded in the
queue by B.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planweave.journal.leases import LeaseStore, QueuedRun
from planweave.journal.postgres import PostgresJournal
from tests.workers.conftest import Schema
from tests.workers.procs import REPO, done, start_worker, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def submit(url: str, gate: Path) -> None:
    journal = await PostgresJournal.open(url)
    store = await LeaseStore.open(url)
    try:
        await store.submit(QueuedRun("approve-me", {"steps": [
            {"id": "first", "tool": "pause", "args": {"seconds": 0.01}},
            {"id": "ship", "tool": "pause", "args": {"seconds": 0.01}, "approval": "ship it?", "after": ["first"]},
        ]}, "test", {}))
        await store.submit(QueuedRun("cancel-me", {"steps": [
            {"id": "stuck", "tool": "wait_for", "args": {"gate": str(gate)}},
        ]}, "test", {}))
    finally:
        await store.close()
        await journal.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def held(pg: Schema, run_id: str, holder: str) -> bool:
    return bool(pg.query("SELECT 1 FROM {s}.planweave_leases WHERE run_id = %s AND holder = %s", (run_id, holder)))


def has(pg: Schema, run_id: str, kind: str, epoch: int) -> bool:
    return bool(pg.query("SELECT 1 FROM {s}.planweave_events WHERE run_id = %s AND kind = %s AND lease_epoch = %s",
                         (run_id, kind, epoch)))


def test_approval_and_cancel_reach_runs_taken_over_by_another_worker(pg_schema: Schema, tmp_path: Path) -> None:
    asyncio.run(submit(pg_schema.url, tmp_path / "never"))
    a = start_worker(pg_schema.url, "A", tmp_path, "--lease", "1.5")
    b = None
    try:
        wait_until("A waiting for the approval", lambda: has(pg_schema, "approve-me", "approval_requested", 1))
        wait_until("A running the stuck step", lambda: has(pg_schema, "cancel-me", "step_started", 1))
        a.kill()
        b = start_worker(pg_schema.url, "B", tmp_path, "--lease", "1.5")
        wait_until("B holding both runs", lambda: has(pg_schema, "approve-me", "run_resumed", 2)
                   and has(pg_schema, "cancel-me", "run_resumed", 2))
        approved = cli("approve", "approve-me", "ship", "--journal", pg_schema.url)
        cancelled = cli("cancel", "cancel-me", "--journal", pg_schema.url)
        assert approved.returncode == 0 and "applies it" in approved.stdout, approved
        assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled
        wait_until("both runs done", lambda: done(pg_schema) == 2, timeout=20)
    finally:
        code = b.stop() if b is not None else None
        if a.proc.poll() is None:
            a.kill()
    assert code == 0, b.text() if b else ""
    rows = pg_schema.query("SELECT run_id, outcome, holder, epoch FROM {s}.planweave_leases ORDER BY run_id")
    assert rows == [("approve-me", "succeeded", "B", 2), ("cancel-me", "cancelled", "B", 2)]
    assert has(pg_schema, "approve-me", "approval_given", 2)


def test_a_run_cancelled_after_its_worker_died_ends_cancelled_in_the_queue(pg_schema: Schema, tmp_path: Path) -> None:
    asyncio.run(submit(pg_schema.url, tmp_path / "never"))
    a = start_worker(pg_schema.url, "A", tmp_path, "--lease", "1.5")
    b = None
    try:
        wait_until("A running the stuck step", lambda: has(pg_schema, "cancel-me", "step_started", 1))
        a.kill()
        cancelled = cli("cancel", "cancel-me", "--journal", pg_schema.url)  # A is gone: marked cancelled directly
        assert cancelled.returncode == 0 and "marked it cancelled" in cancelled.stdout, cancelled
        b = start_worker(pg_schema.url, "B", tmp_path, "--lease", "1.5")
        wait_until("B ending the cancelled run in the queue", lambda: pg_schema.query(
            "SELECT outcome FROM {s}.planweave_leases WHERE run_id = 'cancel-me'") == [("cancelled",)], timeout=30)
    finally:
        code = b.stop() if b is not None else None
    assert code == 0, b.text() if b else ""
    assert not has(pg_schema, "cancel-me", "run_resumed", 2)  # B did not run it again
