"""Kill the driver of a run on Ray with SIGKILL, resume it on the same cluster: finished steps are not run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from planweave.testing.ray_cluster import LocalRayCluster

REPO = Path(__file__).resolve().parents[2]
PLAN = """
steps:
  - {id: first, tool: gated, args: {log: "LOG", gate: "OPEN"}}
  - {id: second, tool: gated, args: {log: "LOG", gate: "GATE"}, after: [first]}
  - {id: last, tool: noop, args: {got: "${second}"}, executor: local}
"""


def planweave(*args: str, cluster: LocalRayCluster) -> list[str]:
    return [sys.executable, "-m", "planweave.cli.main", *args, "--tools", "tests.ray.ray_tools:own_tools",
            "--config", "executor=ray", "--config", f"ray_address={cluster.address}"]


def lines(path: Path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # another process: nothing to wait on but its files


def test_a_killed_driver_resumes_without_running_finished_steps(ray_cluster: LocalRayCluster, tmp_path: Path) -> None:
    log, gate, opened = tmp_path / "log", tmp_path / "gate", tmp_path / "open"
    opened.touch()
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("LOG", str(log)).replace("GATE", str(gate)).replace("OPEN", str(opened)))
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    driver = subprocess.Popen(planweave("run", str(plan), "--journal", journal, "--run-id", "crash", "--json",
                                        cluster=ray_cluster),
                              cwd=REPO, env=ray_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True, text=True)
    try:
        wait_until("the second step to start on Ray",
                   lambda: lines(log) == ["first", "second"] or driver.poll() is not None)
        assert driver.poll() is None, driver.communicate()
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        _, killed_err = driver.communicate(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    assert "resume with: planweave resume crash" in killed_err and "executor=ray" in killed_err

    gate.touch()
    resumed = subprocess.Popen(planweave("resume", "crash", "--journal", journal, "--json", cluster=ray_cluster),
                               cwd=REPO, env=ray_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert lines(log) == ["first", "second", "second"]  # the finished step is not run again
    pids = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert driver.pid not in pids[:2] and resumed.pid != pids[2]  # every attempt ran on Ray
    assert '"status": "succeeded"' in out
