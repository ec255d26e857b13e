"""``planweave run PLAN --watch`` keeps serving the dashboard after the run ended, until SIGINT or SIGTERM, and then
exits with the run's outcome code; with ``--json`` the JSON is printed when the run ends, not at the signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.processes import read_until, running

TOKEN = "watch-token-0123456789abcdef"
SUCCEEDS = {"steps": [
    {"id": "first", "tool": "sleep", "args": {"seconds": 0.05}},
    {"id": "then", "tool": "noop", "after": ["first"]},
]}
FAILS = {"steps": [  # a step that times out, with no retry: the run fails
    {"id": "slow", "tool": "sleep", "args": {"seconds": 30}, "timeout": 0.1, "retries": 0},
]}
STAYS_UP = re.compile(r"^run (\w+) ended \((\w+)\): the dashboard stays up at (http://127\.0\.0\.1:\d+/)#/runs/\1 "
                      r"until Ctrl-C$")


def watch_command(plan: Path, url: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "planweave.cli.main", "run", str(plan), "--journal", url, "--watch", "--config",
            "port=0", *flags]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    env.update({"PLANWEAVE_TOKEN": TOKEN, "COLUMNS": "160", "NO_COLOR": "1"})
    return env


def read_json_object(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The indented JSON object ``proc`` printed on stdout, read up to its closing brace (the process goes on)."""
    lines = read_until(proc, "}", at_start=True)
    parsed: dict[str, Any] = json.loads("\n".join(lines))
    return parsed


@pytest.mark.parametrize(("plan", "signum", "code", "status"), [
    (SUCCEEDS, signal.SIGINT, 0, "succeeded"),
    (FAILS, signal.SIGTERM, 1, "failed"),
], ids=["succeeded-sigint", "failed-sigterm"])
def test_watch_keeps_the_dashboard_up_after_the_run_until_a_signal_then_exits_with_the_runs_code(
        tmp_path: Path, plan: dict[str, Any], signum: signal.Signals, code: int, status: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with running(watch_command(path, url, "--run-id", "w1", "--json"), env=environment(), cwd=tmp_path) as proc:
        # The JSON comes when the run ends, while the process still serves.
        report = read_json_object(proc)
        assert report["run_id"] == "w1"
        assert report["status"] == status
        said = read_until(proc, "the dashboard stays up", stream="stderr")
        found = STAYS_UP.match(said[-1])
        assert found is not None, said
        assert found.group(1, 2) == ("w1", status)
        assert proc.poll() is None
        base = found.group(3)
        with httpx.Client(base_url=base, timeout=10) as client:
            page = client.get("/")
            assert page.status_code == 200
            assert "planweave" in page.text
            shown = client.get("/runs/w1", headers={"Authorization": f"Bearer {TOKEN}"})
            assert shown.status_code == 200, shown.text
            assert shown.json()["status"] == status
        assert proc.poll() is None  # still serving after the requests
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err
    assert out == ""  # the JSON was printed once, when the run ended
    assert "Traceback" not in err
    assert "interrupted" not in err  # the signal only stopped the dashboard: the run had ended


def test_watch_without_json_prints_the_outcome_when_the_run_ends(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(SUCCEEDS), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with running(watch_command(path, url, "--run-id", "w2"), env=environment(), cwd=tmp_path) as proc:
        lines = read_until(proc, "succeeded in ")
        assert "· run w2 ·" in lines[-1]
        read_until(proc, "the dashboard stays up", stream="stderr")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "succeeded in " not in out  # said once, when the run ended
    assert "Traceback" not in err
