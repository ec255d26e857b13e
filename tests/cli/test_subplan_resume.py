"""A three-level sub-plan tree SIGKILLed mid-run and resumed: no finished step runs again, same answer.

``planweave run --goal root`` in a subprocess, against the scripted model server of this process; the grandchild's
second step waits on a gate file, the process is killed while it runs, then ``planweave resume root --model ...``
resumes the root, which resumes its unfinished child, which resumes its unfinished grandchild. Every tool call
appends its step id to a side-effect file (tests/cli/subplan_tools.py), so re-runs are counted outside planweave.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from planweave import open_journal
from planweave.core.state import RunState
from planweave.testing.scripted_llm import ScriptedLLM
from tests.planning.subplan_world import world

HERE = Path(__file__).parent


async def planweave(*args: str, cwd: Path, log: Path, gate: Path) -> asyncio.subprocess.Process:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OPENAI_API_KEY": "sk-x", "PYTHONPATH": path, "SUBPLAN_LOG": str(log),
           "SUBPLAN_GATE": str(gate)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def leaf_state(url: str) -> RunState | None:
    async with open_journal(url) as journal:
        events = await journal.read("root.mid.leaf")
    return RunState.from_events("root.mid.leaf", events) if events else None


async def test_a_killed_sub_plan_tree_resumes_without_running_a_finished_step_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    log, gate = tmp_path / "calls.log", tmp_path / "gate"
    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(world()) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "root", "--run-id", "root", *model, *flags, cwd=tmp_path, log=log,
                               gate=gate)
        killed = False
        for _ in range(600):  # until the grandchild's gated step runs, then kill -9
            await asyncio.sleep(0.05)
            leaf = await leaf_state(url)
            if leaf is not None and "l2" in leaf.records and leaf.records["l2"].status == "running":
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
        if not killed:
            proc.kill()
        _, err = await proc.communicate()
        assert killed, err.decode()
        assert log.read_text().split() == ["m1", "l1", "l2"]
        gate.touch()
        again = await planweave("resume", "root", *model, *flags, cwd=tmp_path, log=log, gate=gate)
        out, err = await asyncio.wait_for(again.communicate(), 120)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["answer"] == "root answer", report
    calls = log.read_text().split()
    assert sorted(calls) == ["l1", "l2", "l2", "m1", "top"]  # only the interrupted l2 ran again
    async with open_journal(url) as journal:
        got = {rid: RunState.from_events(rid, await journal.read(rid)) for rid in ("root.mid", "root.mid.leaf")}
    assert got["root.mid"].status == "succeeded" and got["root.mid"].answer == "mid answer"
    assert got["root.mid.leaf"].status == "succeeded" and got["root.mid.leaf"].answer == "leaf answer"
    assert got["root.mid"].records["m1"].attempts == 1 and got["root.mid.leaf"].records["l1"].attempts == 1


async def test_planweave_approve_reaches_a_step_waiting_inside_a_child(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    log, gate = tmp_path / "calls.log", tmp_path / "gate"
    plans = {"root": [{"id": "sub", "tool": "plan", "args": {"goal": "careful"}}],
             "careful": [{"id": "risky", "tool": "mark_idempotent", "args": {"step": "risky"}, "approval": "ok?"}]}
    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(world(plans)) as base_url:
        proc = await planweave("goal", "root", "--run-id", "root", "--model", "scripted", "--base-url",
                               base_url, *flags, cwd=tmp_path, log=log, gate=gate)
        waiting = False
        for _ in range(600):  # until the child's step waits for its approval
            await asyncio.sleep(0.05)
            async with open_journal(url) as journal:
                events = await journal.read("root.sub")
            state = RunState.from_events("root.sub", events) if events else None
            if state is not None and "risky" in state.records and \
                    state.records["risky"].status == "waiting_approval":
                waiting = True
                break
        if not waiting:
            proc.kill()
        assert waiting, (await proc.communicate())[1].decode()
        approve = await planweave("approve", "root.sub", "risky", "--journal", url, cwd=tmp_path, log=log, gate=gate)
        _, err = await asyncio.wait_for(approve.communicate(), 60)
        assert approve.returncode == 0, err.decode()
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["answer"] == "root answer"
    assert log.read_text().split() == ["risky"]
