"""``planweave worker --no-cache``: the worker's runs reuse no cached output (each step's tool is called, its output
still indexed), and a worker without it serves the same plan from the cache. Real worker processes on PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.workers.conftest import Schema
from tests.workers.procs import start_worker, wait_until
from tests.workers.test_control import cli

pytestmark = [pytest.mark.postgres]

CACHE_TOOLS = "tests.engine.test_result_cache_cli:toolbox"  # square: cacheable, a line in its log per real call


def done(pg: Schema, run_id: str) -> bool:
    return pg.query("SELECT state, outcome FROM {s}.planweave_leases WHERE run_id = %s", (run_id,)) == [
        ("done", "succeeded")]


def run_queued(pg: Schema, plan: Path, tmp: Path, name: str, run_ids: list[str], *flags: str) -> None:
    """``run_ids`` submitted one after the other (each once the one before is done) to a worker started with
    ``flags``."""
    w = start_worker(pg.url, name, tmp, "--tools", CACHE_TOOLS, *flags)
    try:
        for run_id in run_ids:
            queued = cli("submit", str(plan), "--journal", pg.url, "--tools", CACHE_TOOLS, "--run-id", run_id)
            assert queued.returncode == 0, queued
            wait_until(f"{run_id} done", lambda rid=run_id: done(pg, rid), timeout=60)  # type: ignore[misc]
    finally:
        assert w.stop() == 0, w.text()


def test_worker_no_cache_calls_every_step_and_a_plain_worker_reuses_the_outputs(pg_schema: Schema,
                                                                                 tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [
        {"id": "a", "tool": "square", "args": {"x": 3, "log": str(log)}},
        {"id": "b", "tool": "square", "args": {"x": "${a.y}", "log": str(log)}}]}))
    run_queued(pg_schema, plan, tmp_path, "nocache", ["r1", "r2"], "--no-cache")
    assert log.read_text().splitlines() == ["3", "9", "3", "9"]  # r2 reused nothing
    run_queued(pg_schema, plan, tmp_path, "plain", ["r3"])
    assert log.read_text().splitlines() == ["3", "9", "3", "9"]  # r3 was served from what r1/r2 indexed
