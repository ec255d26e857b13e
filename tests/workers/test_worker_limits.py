"""Queued runs carry a model, a budget and a deadline: ``submit --model/--budget-*/--deadline``, applied by the
worker that starts the run and kept by one that takes it over."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from tests.workers.conftest import Schema
from tests.workers.procs import TOOLS, start_worker, wait_until
from tests.workers.test_control import cli

pytestmark = [pytest.mark.postgres]

# Every model call costs 500 tokens: one fits a budget of 550, a second does not.
TWO_CALLS = {"steps": [
    {"id": "first", "tool": "llm", "args": {"prompt": "a", "max_tokens": 100}},
    {"id": "second", "tool": "llm", "args": {"prompt": "b", "max_tokens": 100}, "after": ["first"]},
]}


def spendy(_req: RecordedRequest) -> Reply:
    return Text("fine", completion_tokens=500)


def plan_file(tmp: Path, doc: dict[str, Any]) -> Path:
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def ended(pg: Schema, run_id: str) -> bool:
    return pg.query("SELECT state FROM {s}.planweave_leases WHERE run_id = %s", (run_id,)) == [("done",)]


def report(pg: Schema, run_id: str) -> dict[str, Any]:
    shown = cli("show", run_id, "--journal", pg.url, "--json")
    assert shown.returncode == 0, shown
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def created(pg: Schema, run_id: str) -> dict[str, Any]:
    [(data,)] = pg.query("SELECT data FROM {s}.planweave_events WHERE run_id = %s AND kind = 'run_created'",
                         (run_id,))
    options: dict[str, Any] = data["options"]
    return options


async def test_a_worker_runs_llm_steps_on_the_queued_model_within_the_queued_budget(
        pg_schema: Schema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_file(tmp_path, TWO_CALLS)
    async with ScriptedLLM(spendy) as base_url:
        queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--model", "scripted",
                     "--budget-tokens", "550", "--run-id", "spend")
        assert queued.returncode == 0, queued
        monkeypatch.setenv("OPENAI_API_KEY", os.environ.get("OPENAI_API_KEY", "sk-test"))
        worker = start_worker(pg_schema.url, "lw", tmp_path, "--base-url", base_url)
        try:
            await asyncio.to_thread(wait_until, "the run to end", lambda: ended(pg_schema, "spend"), 60)
        finally:
            worker.stop()
    result = report(pg_schema, "spend")
    assert result["steps"]["first"]["status"] == "succeeded", worker.text()
    assert result["status"] == "failed" and result["steps"]["second"]["status"] == "failed"
    assert "budget" in str(result["steps"]["second"]["error"]) and "550" in str(result["steps"]["second"]["error"])
    limits = created(pg_schema, "spend")["limits"]
    assert limits["budget_tokens"] == 550 and limits["model"] == "scripted"


def test_a_queued_deadline_holds_and_a_worker_taking_the_run_over_keeps_it(pg_schema: Schema, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, {"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 60}}]})
    queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--deadline", "6",
                 "--run-id", "late")
    assert queued.returncode == 0, queued
    first = start_worker(pg_schema.url, "d1", tmp_path, "--lease", "1")
    try:
        wait_until("the run to start", lambda: bool(pg_schema.query(
            "SELECT 1 FROM {s}.planweave_events WHERE run_id = 'late' AND kind = 'step_started'")), 30)
        started = time.monotonic()
        first.kill()  # SIGKILL: the lease expires, another worker takes the run over
    finally:
        if first.proc.poll() is None:
            first.kill()
    second = start_worker(pg_schema.url, "d2", tmp_path, "--lease", "1")
    try:
        wait_until("the run to end", lambda: ended(pg_schema, "late"), 40)
        took = time.monotonic() - started
    finally:
        second.stop()
    result = report(pg_schema, "late")
    assert result["status"] == "cancelled" and "deadline" in str(result.get("error")), result
    assert took < 20, took  # the deadline counted from the first start, not from the takeover (nor the 60 s sleep)
    assert created(pg_schema, "late")["limits"]["deadline"] == 6
    assert "d2" in second.text() and "late" in second.text()


def test_submit_refuses_a_budget_without_a_model_and_a_bad_deadline(pg_schema: Schema, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, {"steps": [{"id": "a", "tool": "noop"}]})
    no_model = cli("submit", str(plan), "--journal", pg_schema.url, "--budget-tokens", "10")
    assert no_model.returncode == 2 and "--budget-tokens applies to the model" in no_model.stderr, no_model
    llm_without_model = cli("submit", str(plan_file(tmp_path, TWO_CALLS)), "--journal", pg_schema.url)
    assert llm_without_model.returncode == 2 and "llm" in llm_without_model.stderr, llm_without_model
    for bad in ("0", "inf"):
        refused = cli("submit", str(plan), "--journal", pg_schema.url, "--deadline", bad)
        assert refused.returncode == 2 and "--deadline" in refused.stderr, refused
        assert "Traceback" not in refused.stderr
