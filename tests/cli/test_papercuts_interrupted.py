"""Issue 27, part 5: an interrupted run's in-flight steps are shown as interrupted, not running: in ``show``, in
``runs`` and in the last frame of a run stopped by Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step, write_plan
from tests.processes import running

PLAN = {
    "name": "long",
    "steps": [
        {"id": "quick", "tool": "noop"},
        {"id": "slow", "tool": "sleep", "args": {"seconds": 60}, "timeout": 120},
    ],
}


def _row(out: str, start: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(start))


def test_the_steps_a_stopped_run_was_running_are_shown_interrupted(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    env = subprocess_env()
    plan = write_plan(tmp_path / "long.yaml", PLAN)
    with running(cli_command("run", str(plan), "--journal", url, "--run-id", "k"), env=env) as proc:
        wait_for_step(url, "k", "slow", "running", proc)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the last frame is drawn, then how to resume
        stopped, _ = proc.communicate(timeout=60)
    shown = subprocess.run(cli_command("show", "k", "--journal", url), env=env, capture_output=True, text=True,
                           timeout=60).stdout
    listed = subprocess.run(cli_command("runs", "--journal", url), env=env, capture_output=True, text=True,
                            timeout=60).stdout

    assert proc.returncode == 130
    for out in (stopped, shown):
        assert _row(out, "run k · long · interrupted · 1 interrupted · 1 succeeded"), out
        assert _row(out, "slow ").split()[1] == "interrupted", out
        assert "running" not in out, out
    assert "1 interrupted · 1 succeeded" in _row(listed, "k "), listed
    assert _row(stopped, "interrupted: resume with planweave resume k")  # on a line of its own, after the frame
