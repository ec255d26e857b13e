"""`planweave resume` after a kill -9 keeps the run's deadline and budget (journaled in run_created), re-binds the
model its llm steps call, and refuses flags that do not apply to the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from tests.processes import journal_bytes

from .test_goal_and_mcp import planweave

KEY = {"OPENAI_API_KEY": "sk-test-key-123456"}
GATED_SLOW = ("steps:\n"
              "  - {id: gate, tool: sleep, args: {seconds: 0.2}}\n"
              "  - {id: slow, tool: sleep, args: {seconds: 30}, after: [gate]}\n")
# Each model call costs 500 tokens: one fits a budget of 550, a second one does not.
LLM_TWICE = ("steps:\n"
             "  - {id: first, tool: llm, args: {prompt: a, max_tokens: 100}}\n"
             "  - {id: gate, tool: sleep, args: {seconds: 30}, after: [first]}\n"
             "  - {id: second, tool: llm, args: {prompt: b, max_tokens: 100}, after: [gate]}\n")


def journal(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


async def killed_while(tmp_path: Path, marker: bytes, *args: str, env: dict[str, str] | None = None) -> None:
    """Start ``planweave run ARGS``, wait until ``marker`` is in its journal, then SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", "run", *args, "--journal", journal(tmp_path), "--json",
        cwd=tmp_path, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(600):  # another process writes the file: nothing to wait on but the file itself
            if marker in journal_bytes(tmp_path):
                break
            await asyncio.sleep(0.05)
        assert marker in journal_bytes(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def test_a_resume_after_kill_9_keeps_the_deadline_the_run_was_started_with(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(GATED_SLOW)
    await killed_while(tmp_path, b'"attempt"', "plan.yaml", "--run-id", "r1", "--deadline", "2")
    started = time.monotonic()
    code, out, err = await planweave("resume", "r1", "--journal", journal(tmp_path), "--json", cwd=tmp_path)
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "cancelled" and report["error"] == "deadline of 2s reached", report
    assert report["steps"]["slow"]["status"] == "cancelled"
    assert time.monotonic() - started < 15  # stopped at the deadline, not after the 30 s step


def spendy(_req: RecordedRequest) -> Reply:
    return Text("fine", completion_tokens=500)


async def test_a_resume_after_kill_9_calls_the_runs_model_within_what_is_left_of_its_budget(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(LLM_TWICE)
    async with ScriptedLLM(spendy) as base_url:
        await killed_while(tmp_path, b'"gate"', "plan.yaml", "--run-id", "r1", "--model", "scripted", "--base-url",
                           base_url, "--budget-tokens", "550", env=KEY)
        # No --model: the run's model is journaled; the endpoint is this machine's (here --base-url).
        code, out, err = await planweave("resume", "r1", "--base-url", base_url, "--deadline", "5",
                                         "--journal", journal(tmp_path), "--json", cwd=tmp_path, env=KEY)
    assert code == 1, err
    report = json.loads(out)
    assert report["steps"]["first"]["status"] == "succeeded"
    assert report["error"] == "deadline of 5s reached"  # --deadline replaces the journaled one (none)
    assert report["steps"]["gate"]["status"] == "cancelled"


async def test_a_resumed_run_spends_only_what_is_left_of_its_budget(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(LLM_TWICE.replace("seconds: 30", "seconds: 1"))
    async with ScriptedLLM(spendy) as base_url:
        await killed_while(tmp_path, b'"gate"', "plan.yaml", "--run-id", "r1", "--model", "scripted", "--base-url",
                           base_url, "--budget-tokens", "550", env=KEY)
        code, out, err = await planweave("resume", "r1", "--base-url", base_url, "--journal", journal(tmp_path),
                                         "--json", cwd=tmp_path, env=KEY)
    assert code == 1, err
    report = json.loads(out)
    assert report["steps"]["gate"]["status"] == "succeeded"
    second = report["steps"]["second"]
    assert second["status"] == "failed" and "budget exceeded" in second["error"] and "of 550" in second["error"]


async def test_resume_flags_that_do_not_apply_to_the_run_are_errors(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(GATED_SLOW)
    await killed_while(tmp_path, b'"attempt"', "plan.yaml", "--run-id", "r1")
    for flags, named in ((["--budget-tokens", "100"], "--budget-tokens"), (["--budget-usd", "1"], "--budget-usd"),
                         (["--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
                         (["--max-replans", "2"], "--max-replans")):
        code, out, err = await planweave("resume", "r1", *flags, "--journal", journal(tmp_path), cwd=tmp_path)
        assert code == 2, (flags, out, err)
        assert named in err, (flags, err)
        assert "Traceback" not in err
