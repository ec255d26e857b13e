"""A --goal run killed mid-way resumes with its model: finished work kept, the joiner answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from planweave import open_journal
from planweave.core.state import RunState
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines


async def planweave(*args: str, cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env={**os.environ, "OPENAI_API_KEY": "sk-x"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def test_a_killed_goal_run_resumes_with_its_model(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    def script(req: RecordedRequest) -> Reply:
        last = str(req.messages[-1]["content"])
        if "If the results answer the goal" in last:
            return Text(json.dumps({"answer": "done after resume"}))
        return Text(plan_lines([
            {"id": "quick", "tool": "noop", "args": {"v": 1}},
            {"id": "slow", "tool": "sleep", "args": {"seconds": 2}},
            {"id": "ask", "tool": "llm", "args": {"prompt": "summarise ${quick.v}"}, "after": ["slow"]},
        ]))

    async with ScriptedLLM(script) as base_url:
        proc = await planweave("goal", "g", "--model", "scripted", "--base-url", base_url,
                               "--journal", url, "--json", cwd=tmp_path)
        run_id = None
        for _ in range(200):  # until 'quick' finished and 'slow' runs, then kill -9
            await asyncio.sleep(0.05)
            async with open_journal(url) as journal:
                ids = await journal.run_ids()
                if ids:
                    state = RunState.from_events(ids[0], await journal.read(ids[0]))
                    if "slow" in state.records and state.records["slow"].status == "running" \
                            and state.records["quick"].status == "succeeded":
                        run_id = ids[0]
                        break
        assert run_id is not None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()

        again = await planweave("resume", run_id, "--journal", url, "--model", "scripted", "--base-url", base_url,
                                "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["answer"] == "done after resume"
    assert report["steps"]["quick"]["attempts"] == 1  # finished before the kill: not run again
    assert report["steps"]["slow"]["attempts"] == 2  # idempotent sleep, interrupted: re-run
    assert report["steps"]["ask"]["status"] == "succeeded"


async def test_a_resumed_goal_run_keeps_the_deadline_and_budget_it_was_started_with(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "too late"}))
        return Text(plan_lines([{"id": "slow", "tool": "sleep", "args": {"seconds": 60}}]))

    async with ScriptedLLM(script) as base_url:
        proc = await planweave("goal", "g", "--model", "scripted", "--base-url", base_url, "--journal", url,
                               "--deadline", "8", "--budget-tokens", "50000", "--json", cwd=tmp_path)
        run_id = None
        for _ in range(200):  # until 'slow' runs, then kill -9
            await asyncio.sleep(0.05)
            async with open_journal(url) as journal:
                ids = await journal.run_ids()
                if ids:
                    state = RunState.from_events(ids[0], await journal.read(ids[0]))
                    if "slow" in state.records and state.records["slow"].status == "running":
                        run_id = ids[0]
                        break
        assert run_id is not None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        loop = asyncio.get_running_loop()
        began = loop.time()
        again = await planweave("resume", run_id, "--journal", url, "--model", "scripted", "--base-url", base_url,
                                "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(again.communicate(), 60)
        took = loop.time() - began
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
    limits = events[0].data["options"]["limits"]
    assert (limits["deadline"], limits["budget_tokens"], limits["model"]) == (8, 50000, "scripted")
    report = json.loads(out)
    assert report["status"] == "cancelled" and "deadline" in str(report.get("error")), (report, err.decode())
    assert took < 20  # the 8 s deadline, counted from the first start: not the 60 s sleep
