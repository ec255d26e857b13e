"""A run waiting for a person survives SIGKILL: resumed, it waits again, and answers from another process apply.

Real processes on a shared SQLite journal: ``planweave run`` waits at an approval step (it does not exit), is killed
with SIGKILL, an approval is journaled while no process runs the run (``recorded``), ``planweave resume`` applies it
and then waits at a ``human.input`` step, whose value is sent from this process while the resumed one runs it
(``applied``, through the engine's control watcher).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave import InputRejected, open_journal, send_approval, send_input
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step

PLAN = {"steps": [
    {"id": "build", "tool": "sleep", "args": {"seconds": 0.05, "result": {"artifact": "v1"}}},
    {"id": "deploy", "tool": "noop", "args": {"what": "${build.artifact}"}, "approval": "Deploy v1?",
     "after": ["build"]},
    {"id": "ask", "tool": "human.input", "args": {"prompt": "Replicas?", "schema": {"type": "integer"}},
     "after": ["deploy"]},
    {"id": "report", "tool": "noop", "args": {"replicas": "${ask}", "deployed": "${deploy.what}"}},
]}


def kinds(url: str, run_id: str) -> list[str]:
    async def read() -> list[str]:
        async with open_journal(url) as journal:
            return [e.kind for e in await journal.read(run_id)]

    return asyncio.run(read())


def wait_for_kind(url: str, run_id: str, kind: str, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if kinds(url, run_id).count(kind) >= count:
            return
        assert proc.poll() is None, f"the process exited early with {proc.returncode}"
        time.sleep(0.05)
    pytest.fail(f"no {count} {kind} event(s) within 30 s")


def answer(url: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    async def go() -> Any:
        async with open_journal(url) as journal:
            return await fn(journal, *args, **kwargs)

    return asyncio.run(go())


def test_killed_while_waiting_resumes_waiting_and_answers_from_other_processes_apply(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(PLAN))
    url = sqlite_url(tmp_path)
    first = subprocess.Popen(cli_command("run", str(plan), "--journal", url, "--run-id", "r1", "--json"),
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(url, "r1", "deploy", "waiting_approval", first)
        time.sleep(0.5)
        assert first.poll() is None  # a step waits for a person: the run stays open
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    assert answer(url, send_approval, "r1", "deploy", approve=True, reason="go") == "recorded"

    second = subprocess.Popen(cli_command("resume", "r1", "--journal", url, "--json"),
                              env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(url, "r1", "ask", "waiting_input", second)
        with pytest.raises(InputRejected, match="'three' is not of type 'integer'"):
            answer(url, send_input, "r1", "ask", "three")
        assert answer(url, send_input, "r1", "ask", 3) == "applied"
        out, err = second.communicate(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "succeeded"
    assert summary["steps"]["deploy"]["attempts"] == 1 and summary["steps"]["report"]["status"] == "succeeded"
    journaled = kinds(url, "r1")
    assert journaled.count("approval_requested") == 1 and journaled.count("approval_given") == 1
    assert journaled.count("step_reply") == 2  # the refused value was never journaled
    assert journaled.count("input_given") == 1
