"""Issue 27, part 5: the ``resume with: ...`` hint of a killed --goal run works as printed (its model and endpoint
from the journal, never a key)."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from planweave import open_journal
from planweave.cli.run_cmd import journaled_endpoint
from planweave.core.state import RunState
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.test_cli import cli_command, journal_view, sqlite_url, subprocess_env
from tests.processes import read_until, running

SCRIPT = {
    "plan": [
        {"id": "quick", "tool": "chatty", "args": {"word": "hi"}},
        {"id": "slow", "tool": "sleep", "args": {"seconds": 1.0, "result": {"slept": True}}},
    ],
    "answer": "done after resume",
}


def _wait_running(url: str, run_id: str, step: str, proc: subprocess.Popen[str]) -> None:
    """Until the planner has written ``step`` and it runs (bounded); fail if the run exited first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = journal_view(url, run_id)
        rec = seen.state.records.get(step) if seen is not None and seen.state is not None else None
        if rec is not None and rec.status == "running":
            return
        assert proc.poll() is None, f"the run exited early with {proc.returncode}"
        time.sleep(0.05)
    pytest.fail(f"step '{step}' of run '{run_id}' was not running within 30 s")


async def _running(url: str, run_id: str, step: str) -> bool:
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
    rec = RunState.from_events(run_id, events).records.get(step) if events else None
    return rec is not None and rec.status == "running"


def _hint(line: str) -> list[str]:
    """The command a ``run ID started (resume with: COMMAND)`` line prints, as the argv a shell would run."""
    command = line.split("(resume with: ", 1)[1].rstrip(")")
    argv = shlex.split(command)
    assert argv[:2] == ["planweave", "resume"], line
    return [*cli_command(), *argv[1:]]


def test_the_resume_hint_of_a_killed_goal_run_works_as_printed(tmp_path: Path) -> None:
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(SCRIPT), encoding="utf-8")
    url = sqlite_url(tmp_path)
    env = {**subprocess_env(), "OPENAI_API_KEY": "sk-not-in-the-hint"}
    with running(cli_command("goal", "g", "--model", "scripted:script.yaml", "--tools", "noisy_tools:toolbox",
                             "--journal", url, "--run-id", "killed"), env=env, cwd=tmp_path) as proc:
        started = read_until(proc, "run killed started")[-1]
        _wait_running(url, "killed", "slow", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    argv = _hint(started)
    assert "--model" not in argv and "sk-not-in-the-hint" not in started  # the journal knows the model; no key

    untooled = subprocess.run([a for a in argv if a not in ("--tools", "noisy_tools:toolbox")], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    resumed = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert untooled.returncode == 2 and "unknown tool 'chatty'" in untooled.stderr
    assert "resume it with the --tools and --mcp it was run with" in untooled.stderr

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "succeeded" in resumed.stdout and "done after resume" in resumed.stdout


async def test_a_goal_run_given_a_base_url_resumes_on_it_without_being_given_it_again(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    env = {k: v for k, v in subprocess_env().items() if k != "OPENAI_BASE_URL"}
    env["OPENAI_API_KEY"] = "sk-x"

    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "answered at the journaled endpoint"}))
        return Text(plan_lines([{"id": "slow", "tool": "sleep", "args": {"seconds": 1.0}}]))

    async with ScriptedLLM(script) as base_url:
        proc = await asyncio.create_subprocess_exec(
            *cli_command("goal", "g", "--model", "m", "--base-url", base_url, "--journal", url, "--run-id",
                         "ep"), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        started = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        while not await _running(url, "ep", "slow"):
            assert proc.returncode is None
            await asyncio.sleep(0.05)
        proc.kill()
        await proc.wait()
        argv = _hint(started)
        resumed = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(resumed.communicate(), 120)

    assert "--base-url" not in argv  # journaled: the resume reads it back
    assert resumed.returncode == 0, (out + err).decode()
    assert "answered at the journaled endpoint" in out.decode()
    async with open_journal(url) as journal:
        created = (await journal.read("ep", kind="run_created"))[0]
    assert created.data["options"]["limits"]["base_url"] == base_url
    assert journaled_endpoint("http://user:secret@127.0.0.1:8000/v1") is None  # a credential stays out
    assert journaled_endpoint("https://api.example.test/v1?key=sk-1") is None
