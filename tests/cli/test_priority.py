"""``--priority`` of ``run`` (plan files and goals) and ``submit``: journaled in ``run_created``; a bad one exits 2."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.test_goal_and_mcp import planweave
from tests.workers.conftest import Schema, pg_schema
from tests.workers.procs import TOOLS, start_worker, wait_until
from tests.workers.test_control import cli

__all__ = ["pg_schema"]  # the fixture, imported for the worker's test


def journaled_priority(db: Path) -> object:
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute("SELECT data FROM events WHERE kind = 'run_created'").fetchone()
    return json.loads(data)["options"].get("priority")


async def test_run_journals_the_priority_of_a_plan_file_and_refuses_one_that_is_not_a_number(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps: [{id: a, tool: noop}]\n")
    db = tmp_path / "runs.db"
    code, out, err = await planweave("run", str(plan), "--journal", f"sqlite:///{db}", "--config", "priority=3",
                                     "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["status"] == "succeeded", err
    assert journaled_priority(db) == 3.0
    for bad in ("nan", "inf", "high"):
        code, _, err = await planweave("run", str(plan), "--journal", "memory://", "--config", f"priority={bad}",
                                       cwd=tmp_path)
        assert code == 2 and "key 'priority'" in err and "Traceback" not in err, err


async def test_run_journals_the_priority_of_a_goal(tmp_path: Path) -> None:
    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "done"}))
        return Text(plan_lines([{"id": "a", "tool": "noop"}]))

    db = tmp_path / "runs.db"
    async with ScriptedLLM(script) as base_url:
        code, out, err = await planweave("goal", "g", "--model", "scripted", "--base-url", base_url,
                                         "--journal", f"sqlite:///{db}", "--config", "priority=-2", "--json",
                                         cwd=tmp_path, env={"OPENAI_API_KEY": "sk-test"})
    assert code == 0 and json.loads(out)["answer"] == "done", err
    assert journaled_priority(db) == -2.0


@pytest.mark.postgres
def test_submit_hands_the_priority_to_the_worker_that_runs_it(pg_schema: Schema, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [{"id": "a", "tool": "noop"}]}))
    queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--priority", "7",
                 "--run-id", "urgent")
    assert queued.returncode == 0, queued
    worker = start_worker(pg_schema.url, "pw", tmp_path)
    try:
        wait_until("the run to end", lambda: pg_schema.query(
            "SELECT state FROM {s}.planweave_leases WHERE run_id = 'urgent'") == [("done",)], timeout=60)
    finally:
        worker.stop()
    [(data,)] = pg_schema.query("SELECT data FROM {s}.planweave_events WHERE run_id = 'urgent' AND "
                                "kind = 'run_created'")
    assert data["options"]["priority"] == 7.0


