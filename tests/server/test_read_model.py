"""One read model of a journaled run: ``planweave show RUN --json`` and ``GET /runs/{id}`` say the same thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .conftest import start_live

SHARED = ("run_id", "status", "steps", "tokens", "cost_usd", "outputs", "waiting", "unbounded", "root_cause",
          "error", "answer", "plan_versions")


def cli(*args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.stdout, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


async def test_show_json_and_get_run_agree_on_the_shared_fields(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "agree", "steps": [
        {"id": "a", "tool": "noop", "args": {"x": 1}},
        {"id": "slow", "tool": "noop", "args": {"y": "${a.x}"}, "timeout": 2 * 86400},  # may wait forever
        {"id": "bad", "tool": "shell", "args": {"argv": ["sh", "-c", "exit 3"]}, "after": ["a"]},
    ], "on_failure": "continue"}), encoding="utf-8")
    ran = cli("run", str(plan), "--journal", url, "--run-id", "r1", "--json")
    assert ran["status"] == "failed"
    shown = cli("show", "r1", "--journal", url, "--json")
    async with start_live(url, recover=False) as live, live.client() as client:
        resp = await client.get("/runs/r1")
    assert resp.status_code == 200, resp.text
    served = resp.json()
    missing = [(k, "cli" if k not in shown else "server") for k in SHARED if k not in shown or k not in served]
    assert not missing, f"fields missing: {missing}"
    assert {k: shown[k] for k in SHARED} == {k: served[k] for k in SHARED}
    assert served["unbounded"] == ["slow"]
    assert served["waiting"] == {}
    assert served["outputs"]["a"] == {"x": 1}
