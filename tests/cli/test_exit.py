"""``planweave run`` ends when its run ends, whatever its tools raise, block on or leave behind.

Real subprocesses; the time to exit is measured from the run's ``run_finished`` event (wall clock) to the moment
the process is seen gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from planweave import Event, open_journal
from tests.cli.test_cli import cli_command, journal_view, sqlite_url, subprocess_env, wait_for_step, write_plan

EXIT_WITHIN_S = 1.0  # the promise: the process is gone this soon after its run has ended


def run_cli(tmp_path: Path, doc: dict[str, Any], *extra: str, timeout: float = 60) -> tuple[int, str, str, float]:
    """Run ``doc`` with the exit tools; return (exit code, stdout, stderr, wall time when the process had exited)."""
    plan = write_plan(tmp_path / "plan.yaml", doc)
    proc = subprocess.run(
        cli_command("run", str(plan), "--journal", sqlite_url(tmp_path), "--run-id", "r", "--tools",
                    "exit_tools:toolbox", "--json", *extra),
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr, time.time()


def journaled(url: str, kind: str, run_id: str = "r") -> list[Event]:
    """The run's events of one kind, as another process reads them from the journal."""

    async def read() -> list[Event]:
        async with open_journal(url) as journal:
            return list(await journal.read(run_id, kind=kind))

    return asyncio.run(read())


def finished_at(url: str, run_id: str = "r") -> float:
    """When the run's ``run_finished`` was journaled (its wall-clock time)."""
    return journaled(url, "run_finished", run_id)[-1].at


@pytest.mark.parametrize(("tool", "kind"), [("exit_async", "exit"), ("exit_sync", "exit"),
                                             ("interrupt_async", "interrupted")])
def test_a_tool_raising_system_exit_or_keyboard_interrupt_fails_its_step(tmp_path: Path, tool: str,
                                                                         kind: str) -> None:
    code, out, err, _ = run_cli(tmp_path, {"steps": [
        {"id": "bad", "tool": tool},
        {"id": "fine", "tool": "noop", "args": {"v": 1}},
    ]})
    assert "Traceback" not in err
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "failed"
    assert report["steps"]["bad"]["status"] == "failed"
    assert report["steps"]["fine"]["status"] == "succeeded"
    seen = journal_view(sqlite_url(tmp_path), "r")
    assert seen is not None and seen.status == "failed"
    assert [e.data["kind"] for e in journaled(sqlite_url(tmp_path), "step_failed")] == [kind]


def test_the_cli_exits_promptly_after_a_blocking_sync_step_times_out(tmp_path: Path) -> None:
    code, out, err, exited = run_cli(tmp_path, {"steps": [
        {"id": "slow", "tool": "block", "args": {"seconds": 25}, "timeout": 1},
    ]})
    assert code == 1, err
    assert json.loads(out)["steps"]["slow"]["status"] == "failed"
    assert exited - finished_at(sqlite_url(tmp_path)) < EXIT_WITHIN_S


def test_the_cli_exits_promptly_after_leaving_non_daemon_threads(tmp_path: Path) -> None:
    code, out, err, exited = run_cli(tmp_path, {"steps": [
        {"id": "leaver", "tool": "leave_thread", "args": {"seconds": 30}},
    ]})
    assert code == 0, err
    assert json.loads(out)["status"] == "succeeded"  # stdout was flushed before the process ended
    assert exited - finished_at(sqlite_url(tmp_path)) < EXIT_WITHIN_S


def test_the_cli_exits_promptly_after_cancelling_100_blocking_sync_steps(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    plan = write_plan(tmp_path / "plan.yaml", {"steps": [
        {"id": f"s{i}", "tool": "block", "args": {"seconds": 60}} for i in range(100)
    ]})
    with subprocess.Popen(
        cli_command("run", str(plan), "--journal", url, "--run-id", "r", "--tools", "exit_tools:toolbox", "--json",
                    "--concurrency", "100"),
        cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:
        try:
            wait_for_step(url, "r", "s99", "running", proc)
            subprocess.run(cli_command("cancel", "r", "--journal", url), env=subprocess_env(), check=True,
                           capture_output=True, timeout=30)
            out, err = proc.communicate(timeout=30)
            exited = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 1, err
    assert json.loads(out)["status"] == "cancelled"
    assert exited - finished_at(url) < EXIT_WITHIN_S


def test_a_process_isolated_step_stuck_in_sleep_is_killed_at_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "worker.pid"
    code, out, err, exited = run_cli(tmp_path, {"steps": [
        # 3 s: time for the spawned worker to start and write its pid, also on a loaded machine
        {"id": "stuck", "tool": "stuck", "isolation": "process", "timeout": 3,
         "args": {"seconds": 60, "pidfile": str(pidfile)}},
    ]})
    assert code == 1, err
    assert json.loads(out)["steps"]["stuck"]["status"] == "failed"
    assert exited - finished_at(sqlite_url(tmp_path)) < EXIT_WITHIN_S
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker is gone (and reaped)
