"""A ``planweave worker --executor ray`` runs the queued runs' steps on a real cluster; ``executor: local`` stays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planweave.testing.ray_cluster import LocalRayCluster
from tests.workers.conftest import Schema, pg_schema
from tests.workers.procs import wait_until
from tests.workers.test_control import cli

__all__ = ["pg_schema"]  # the fixture, imported for these tests

pytestmark = [pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
TOOLS = "tests.ray.ray_tools:own_tools"


def test_a_worker_runs_queued_steps_on_ray(ray_cluster: LocalRayCluster, pg_schema: Schema, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [
        {"id": "remote", "tool": "where", "args": {"note": "on ray"}},
        {"id": "here", "tool": "where", "args": {"note": "${remote.note}"}, "executor": "local"},
    ]}))
    queued = cli("submit", str(plan), "--journal", pg_schema.url, "--tools", TOOLS, "--run-id", "on-ray", "--json")
    assert queued.returncode == 0, queued
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "planweave.cli.main", "worker", "--journal", pg_schema.url, "--name", "rw",
         "--tools", TOOLS, "--executor", "ray", "--ray-address", ray_cluster.address],
        cwd=REPO, env=ray_cluster.env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        def ended() -> bool:
            rows = pg_schema.query("SELECT state FROM {s}.planweave_leases WHERE run_id = 'on-ray'")
            return rows == [("done",)] or worker.poll() is not None

        wait_until("the worker to finish the run", ended, timeout=120)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
    shown = cli("show", "on-ray", "--journal", pg_schema.url, "--json")
    assert shown.returncode == 0, shown
    report = json.loads(shown.stdout)
    assert report["status"] == "succeeded", report
    outputs = report["outputs"]
    assert outputs["remote"]["pid"] != worker.pid and outputs["remote"]["assigned"].get("CPU") == 1.0
    assert outputs["here"]["pid"] == worker.pid and outputs["here"]["assigned"] == {}
    assert outputs["here"]["note"] == "on ray"
