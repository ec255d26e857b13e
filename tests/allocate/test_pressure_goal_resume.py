"""A --goal run started with --deadline-pressure journals the threshold; killed and resumed with its model, its
forecast falls below it and the planner re-plans with the time left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from planweave import open_journal
from planweave.core.state import RunState
from planweave.limits import JournaledLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines


async def planweave(*args: str, cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env={**os.environ, "OPENAI_API_KEY": "sk-x"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


# 'slow' runs when the first process is killed; on resume the plan still needs it (1 s, it says) and 'write' (40 s):
# late for a 30 s deadline, so the resumed run's first forecast fires the pressure.
SLOW = [{"id": "slow", "tool": "sleep", "args": {"seconds": 60}, "estimate": {"duration": 1}},
        {"id": "write", "tool": "sleep", "args": {"seconds": 1}, "after": ["slow"], "estimate": {"duration": 40}}]
QUICK = [{"id": "gist", "tool": "noop", "args": {"v": "gist"}}]


def script(request: RecordedRequest) -> Reply:
    text = " ".join(str(m.get("content")) for m in request.messages)
    if "If the results answer the goal" in text:
        return Text(json.dumps({"answer": "the gist"}))
    if "Why a new plan is needed" in text:
        return Text(plan_lines(QUICK))
    return Text(plan_lines(SLOW))


async def test_a_resumed_goal_run_keeps_its_deadline_pressure_and_re_plans_with_the_time_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    server = ScriptedLLM(script)
    async with server as base_url:
        proc = await planweave("goal", "g", "--model", "scripted", "--base-url", base_url, "--journal", url,
                               "--deadline", "30", "--config", "deadline_pressure=0.5", "--json", cwd=tmp_path)
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
        async with open_journal(url) as journal:
            before = list(await journal.read(run_id))
        again = await planweave("resume", run_id, "--journal", url, "--model", "scripted", "--base-url", base_url,
                                "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert JournaledLimits.from_events(before).pressure == 0.5
    assert not [e for e in before if e.kind == "escalation"]  # the first process never saw it late
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["answer"] == "the gist"
    async with open_journal(url) as journal:
        events = list(await journal.read(run_id))
    (pressure,) = [e for e in events if e.kind == "escalation" and e.data.get("rung") == "deadline_pressure"]
    assert pressure.data["action"] == "replan"
    replans = [" ".join(str(m.get("content")) for m in r.messages) for r in server.chat_requests
               if "Why a new plan is needed" in " ".join(str(m.get("content")) for m in r.messages)]
    assert len(replans) == 1 and "deadline pressure" in replans[0] and "s remain until the deadline" in replans[0]
