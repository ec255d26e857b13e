"""Issue 27, part 5: the elapsed time of a resumed run is the time it ran (its live spans summed), not the span
since it was created, downtime included; the wall-clock span is said beside it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step, write_plan
from tests.processes import running

DOWN_S = 3.0  # how long no process runs the run
PLAN = {
    "name": "twice",
    "steps": [
        {"id": "first", "tool": "sleep", "args": {"seconds": 0.2}},
        {"id": "second", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["first"]},
    ],
}


def test_a_resumed_run_reports_the_time_it_ran_and_the_wall_clock_apart(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    env = subprocess_env()
    plan = write_plan(tmp_path / "twice.yaml", PLAN)
    with running(cli_command("run", str(plan), "--journal", url, "--run-id", "r"), env=env) as proc:
        wait_for_step(url, "r", "second", "running", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    time.sleep(DOWN_S)  # the downtime itself: no process runs the run
    resumed = subprocess.run(cli_command("resume", "r", "--journal", url), env=env, capture_output=True,
                             text=True, timeout=60)
    report = json.loads(subprocess.run(cli_command("show", "r", "--journal", url, "--json"), env=env,
                                       capture_output=True, text=True, timeout=60).stdout)
    shown = subprocess.run(cli_command("show", "r", "--journal", url), env=env, capture_output=True, text=True,
                           timeout=60).stdout

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert report["makespan_s"] > DOWN_S  # the wall-clock span holds the downtime
    assert 0.7 <= report["ran_s"] <= report["makespan_s"] - DOWN_S + 0.1, report
    header = shown.splitlines()[0]
    found = re.search(r" · ([\d.]+)s \(wall clock ([\d.]+)s\)$", header)
    assert found is not None, header
    assert float(found.group(1)) < DOWN_S < float(found.group(2))
    assert re.search(r"succeeded in [\d.]+s \(wall clock [\d.]+s\)", resumed.stdout), resumed.stdout
