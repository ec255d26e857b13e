"""Tier tables through the run queue: ``submit --tiers FILE`` queues the table with the run, the worker that starts
it allocates its ``model: auto`` steps from it (journaled in ``run_created``), and a worker taking the run over
allocates from the journaled table."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from tests.workers.conftest import PG_DEFAULT, Schema
from tests.workers.procs import TOOLS, start_worker, wait_until
from tests.workers.test_control import cli
from tests.workers.test_worker_limits import created, ended, report

pytestmark = [pytest.mark.postgres]

TIERS = {
    "small": {"model": "m-small", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}


@pytest.fixture
def pg_schema() -> Iterator[Schema]:
    """A schema of its own (as tests/workers' fixture of that name, which a test outside that folder cannot use)."""
    base = os.environ.get("PLANWEAVE_TEST_PG", PG_DEFAULT)
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        if os.environ.get("PLANWEAVE_SKIP_PG") == "1":
            pytest.skip(f"PostgreSQL at {base} unreachable and PLANWEAVE_SKIP_PG=1: {exc}")
        pytest.fail(f"PostgreSQL at {base} is unreachable ({exc}); set PLANWEAVE_SKIP_PG=1 to skip these tests")
    name = f"pw_tiers_{secrets.token_hex(5)}"
    try:
        yield Schema(f"{base}{'&' if '?' in base else '?'}schema={name}", name, admin)
    finally:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        admin.close()


def answer(request: RecordedRequest) -> Reply:
    return Text(f"from {request.body['model']}")


def files(tmp: Path, seconds: float) -> tuple[Path, Path]:
    plan, tiers = tmp / "plan.yaml", tmp / "tiers.yaml"
    plan.write_text(yaml.safe_dump({"steps": [
        {"id": "first", "tool": "sleep", "args": {"seconds": seconds}},
        {"id": "a", "tool": "llm", "after": ["first"],
         "args": {"prompt": "a?", "model": "auto", "tiers": ["small", "large"], "max_tokens": 10}}]}))
    tiers.write_text(yaml.safe_dump(TIERS))
    return plan, tiers


def allocations(pg: Schema, run_id: str) -> list[str]:
    rows = pg.query("SELECT data FROM {s}.planweave_events WHERE run_id = %s AND kind = 'allocation' ORDER BY pos",
                    (run_id,))
    return [str(data["model"]) for (data,) in rows]


async def test_a_worker_allocates_a_queued_runs_model_auto_steps_from_its_tiers(
        pg_schema: Schema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, tiers = files(tmp_path, 0.0)
    monkeypatch.setenv("OPENAI_API_KEY", os.environ.get("OPENAI_API_KEY", "sk-test"))
    async with ScriptedLLM(answer) as base_url:
        queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--model", "m-small",
                     "--tiers", str(tiers), "--run-id", "tiered")
        assert queued.returncode == 0, queued
        worker = start_worker(pg_schema.url, "tw", tmp_path, "--base-url", base_url)
        try:
            await asyncio.to_thread(wait_until, "the run to end", lambda: ended(pg_schema, "tiered"), 60)
        finally:
            worker.stop()
    result = report(pg_schema, "tiered")
    assert result["status"] == "succeeded", worker.text()
    assert allocations(pg_schema, "tiered") and set(allocations(pg_schema, "tiered")) <= {"m-small", "m-large"}
    assert created(pg_schema, "tiered")["limits"]["tiers"]["large"]["model"] == "m-large"


async def test_a_worker_taking_a_run_over_allocates_from_the_journaled_tiers(
        pg_schema: Schema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, tiers = files(tmp_path, 3.0)
    monkeypatch.setenv("OPENAI_API_KEY", os.environ.get("OPENAI_API_KEY", "sk-test"))
    async with ScriptedLLM(answer) as base_url:
        queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--model", "m-small",
                     "--tiers", str(tiers), "--run-id", "moved")
        assert queued.returncode == 0, queued
        first = start_worker(pg_schema.url, "t1", tmp_path, "--lease", "1", "--base-url", base_url)
        try:
            await asyncio.to_thread(wait_until, "the run to start", lambda: bool(pg_schema.query(
                "SELECT 1 FROM {s}.planweave_events WHERE run_id = 'moved' AND kind = 'step_started'")), 30)
        finally:
            first.kill()  # SIGKILL while 'first' sleeps: 'a' was never allocated
        second = start_worker(pg_schema.url, "t2", tmp_path, "--lease", "1", "--base-url", base_url)
        try:
            await asyncio.to_thread(wait_until, "the run to end", lambda: ended(pg_schema, "moved"), 60)
        finally:
            second.stop()
    result = report(pg_schema, "moved")
    assert result["status"] == "succeeded", second.text()
    assert len(allocations(pg_schema, "moved")) == 1
    assert "took over run moved" in second.text()


def test_submit_refuses_a_bad_tiers_file_or_tiers_without_a_model(pg_schema: Schema, tmp_path: Path) -> None:
    plan, tiers = files(tmp_path, 0.0)
    no_model = cli("submit", str(plan), "--journal", pg_schema.url, "--tiers", str(tiers))
    assert no_model.returncode == 2 and "--tiers applies to the model" in no_model.stderr, no_model
    tiers.write_text(yaml.safe_dump({"small": {**TIERS["small"], "p_success": 3}}))
    bad = cli("submit", str(plan), "--journal", pg_schema.url, "--model", "m", "--tiers", str(tiers))
    assert bad.returncode == 2, bad
    assert "tier 'small': p_success must be in [0, 1]" in " ".join(bad.stderr.split()) and "Traceback" not in bad.stderr
