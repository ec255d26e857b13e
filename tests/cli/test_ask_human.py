"""``planweave goal --ask-human`` and ``--on-failure``, as real processes.

The model is the scripted OpenAI-compatible server, run as its own process; the person answers from this process
through the shared SQLite journal (:func:`planweave.send_input`), as ``planweave send`` would.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave import open_journal, send_input
from planweave.cli.main import read_run
from planweave.core.state import RunState
from tests.cli.model_process import scripted_model
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env

GOAL_PLAN = [
    {"id": "src", "tool": "file.read", "args": {"path": "in.txt"}},
    {"id": "out", "tool": "noop", "args": {"text": "${src.text}"}},
]


@pytest.fixture
def model(tmp_path: Path) -> Iterator[str]:
    """A scripted model server process: it writes GOAL_PLAN, then answers every later call (the joiner)."""
    with scripted_model(tmp_path / "script.jsonl", [GOAL_PLAN]) as url:
        yield url


def step_status(url: str, run_id: str, step: str) -> str | None:
    async def read() -> str | None:
        try:
            found = await read_run(url, run_id)
        except Exception:  # the run is not in the journal yet
            return None
        rec = found.state.records.get(step) if found.state is not None else None
        return rec.status if rec is not None else None

    return asyncio.run(read())


def journaled(url: str, run_id: str) -> RunState:
    found = asyncio.run(read_run(url, run_id))
    assert found.state is not None
    return found.state


def wait_until_waiting(url: str, run_id: str, step: str, proc: subprocess.Popen[str]) -> None:
    """Poll the journal (another process writes it) until ``step`` waits for a value; fail if the run exited."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if step_status(url, run_id, step) == "waiting_input":
            return
        assert proc.poll() is None, f"the run exited early: {proc.communicate()}"
        time.sleep(0.05)
    pytest.fail(f"step '{step}' never waited for input")


def give(url: str, run_id: str, step: str, value: Any) -> str:
    async def go() -> str:
        async with open_journal(url) as journal:
            return await send_input(journal, run_id, step, value)

    return asyncio.run(go())


@pytest.mark.parametrize("action", ["retry", "skip", "abort"])
def test_ask_human_turns_a_final_failure_into_a_question_answered_from_another_process(
    tmp_path: Path, model: str, action: str,
) -> None:
    url = sqlite_url(tmp_path)
    proc = subprocess.Popen(
        cli_command("goal", "read in.txt", "--ask-human", "--max-replans", "0", "--model", "m",
                    "--base-url", model, "--journal", url, "--run-id", "g1", "--json"),
        cwd=tmp_path, env={**subprocess_env(), "OPENAI_API_KEY": "sk-test"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_waiting(url, "g1", "src_ask", proc)
        if action == "retry":
            (tmp_path / "in.txt").write_text("from the file")
        value = {"action": action, "value": {"text": "from a person"}} if action == "skip" else {"action": action}
        assert give(url, "g1", "src_ask", value) == "applied"
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    report = json.loads(out)
    assert [e["rung"] for e in journaled(url, "g1").escalations] == (["human", "fail"] if action == "abort"
                                                                      else ["human"])
    if action == "abort":
        assert proc.returncode == 1, err
        assert report["status"] == "failed" and "step 'src' failed" in report["error"]
        return
    assert proc.returncode == 0, err
    assert report["status"] == "succeeded" and report["answer"] == "done"
    expected = "from the file" if action == "retry" else "from a person"
    assert report["outputs"]["out"] == {"text": expected}
    assert report["plan_versions"][-1]["trigger"] == f"human_{action}"


def test_ask_human_and_on_failure_are_refused_where_they_do_not_apply(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [{"id": "a", "tool": "noop", "args": {}}]}))
    cases = {
        # one command per purpose: a plan file's run has no planner to ask, a goal's no plan's on_failure
        "--ask-human": (["run", str(plan), "--ask-human"], "No such option: --ask-human"),
        "--on-failure goal": (["goal", "g", "--on-failure", "stop"], "No such option: --on-failure"),
        "--on-failure value": (["run", str(plan), "--on-failure", "halt"], "'halt' is not one of"),
    }
    for name, (args, message) in cases.items():
        done = subprocess.run(cli_command(*args, "--journal", "memory://"), env=subprocess_env(), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert message in " ".join(done.stderr.split()), (name, done.stderr)


PLAN = {"steps": [
    {"id": "src", "tool": "file.read", "args": {"path": "missing.txt"}},
    {"id": "long", "tool": "sleep", "args": {"seconds": 1.5}},
]}


@pytest.mark.parametrize(("plan_key", "flag", "long_status"), [
    (None, None, "cancelled"),  # plan files stop by default
    (None, "continue", "succeeded"),
    ("continue", "stop", "cancelled"),  # the flag overrides the plan key
    ("stop", "continue", "succeeded"),
])
def test_on_failure_flag_decides_whether_other_branches_run_on(
    tmp_path: Path, plan_key: str | None, flag: str | None, long_status: str,
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({**PLAN, **({"on_failure": plan_key} if plan_key else {})}))
    args = ["run", str(plan), "--journal", "memory://", "--json", *(["--on-failure", flag] if flag else [])]
    done = subprocess.run(cli_command(*args), env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "failed" and report["steps"]["src"]["status"] == "failed"
    assert report["steps"]["long"]["status"] == long_status
