"""A goal run SIGKILLed while its planner still writes the plan resumes by finishing the plan, not by joining it.

``planweave run --goal`` in a subprocess, against the scripted model server of this process whose planner reply
stalls after some lines (:class:`Stall`): the steps of those lines run, the process is killed, and ``planweave resume``
asks the planner again (shown what it had written), runs the steps it adds and only then joins. Every tool call
appends its step id to a side-effect file (tests/cli/subplan_tools.py), so re-runs are counted outside planweave.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planweave import open_journal
from planweave.core.state import RunState
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Stall, Text, plan_lines
from tests.planning.subplan_world import MARK, goal_of, world

HERE = Path(__file__).parent
JOINER = "If the results answer the goal"

PLAN: list[dict[str, Any]] = [
    {"id": "s1", "tool": MARK, "args": {"step": "s1"}},
    {"id": "s2", "tool": MARK, "args": {"step": "s2"}},
    {"id": "s3", "tool": MARK, "args": {"step": "s3", "v": "${s1.step}"}},
    {"id": "s4", "tool": MARK, "args": {"step": "s4", "v": "${s2.step}"}, "after": ["s3"]},
]


async def planweave(*args: str, cwd: Path, log: Path) -> asyncio.subprocess.Process:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OPENAI_API_KEY": "sk-x", "PYTHONPATH": path, "SUBPLAN_LOG": str(log)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def kill_when(proc: asyncio.subprocess.Process, url: str, run_id: str,
                    ready: Callable[[RunState], bool]) -> None:
    """SIGKILL ``proc`` once run ``run_id`` in journal ``url`` (written by ``proc``) is in a state where ``ready``
    holds; fail, with its stderr, if that takes more than 30 s."""
    for _ in range(600):
        async with open_journal(url) as journal:
            events = await journal.read(run_id)
        if events and ready(RunState.from_events(run_id, events)):
            proc.send_signal(signal.SIGKILL)
            await proc.communicate()
            assert proc.returncode == -signal.SIGKILL
            return
        await asyncio.sleep(0.05)
    proc.kill()
    _, err = await proc.communicate()
    raise AssertionError(f"run '{run_id}' never reached the state to kill it in: {err.decode()}")


def succeeded(*steps: str) -> Callable[[RunState], bool]:
    return lambda state: all(s in state.records and state.records[s].status == "succeeded" for s in steps)


async def test_a_goal_run_killed_while_its_planner_streams_resumes_by_finishing_the_plan(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planner: list[RecordedRequest] = []

    def script(req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "all four"}))
        planner.append(req)
        if len(planner) == 1:  # two lines and half of the third, then nothing until the process is killed
            return Stall(after=plan_lines(PLAN[:2]) + '{"id": "s3", "tool"', seconds=None)
        return Text(plan_lines(PLAN[2:]))  # asked again: the steps still missing

    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(script) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "four marks", "--run-id", "g1", *model, *flags, cwd=tmp_path,
                               log=log)
        await kill_when(proc, url, "g1", succeeded("s1", "s2"))
        again = await planweave("resume", "g1", *model, *flags, cwd=tmp_path, log=log)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["answer"] == "all four", report
    assert {sid: s["status"] for sid, s in report["steps"].items()} == {f"s{i}": "succeeded" for i in range(1, 5)}
    assert sorted(log.read_text().split()) == ["s1", "s2", "s3", "s4"]  # each once: s1, s2 not run again
    assert len(planner) == 2  # asked once more, shown the lines it had written
    shown = [m["content"] for m in planner[1].messages if m["role"] == "assistant"]
    assert len(shown) == 1 and '"id":"s1"' in shown[0] and '"id":"s2"' in shown[0]
    async with open_journal(url) as journal:
        state = RunState.from_events("g1", await journal.read("g1"))
    assert state.versions[0]["added"] == ["s1", "s2", "s3", "s4"]  # all on the initial version, each once


async def test_a_goal_run_killed_while_its_planner_repairs_rejected_lines_resumes_by_finishing_the_plan(
        tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planner: list[RecordedRequest] = []
    broken = {**PLAN[2], "tool": "no_such_tool"}

    def script(req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "all four"}))
        planner.append(req)
        if len(planner) == 1:  # a whole answer, one line of it rejected
            return Text(plan_lines([*PLAN[:2], broken]))
        if len(planner) == 2:  # the repair of that line: stalls until the process is killed
            return Stall(seconds=None)
        return Text(plan_lines(PLAN))  # asked again after the resume, it restates the whole plan

    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(script) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "four marks", "--run-id", "g1", *model, *flags, cwd=tmp_path,
                               log=log)
        await kill_when(proc, url, "g1", lambda state: len(planner) == 2 and succeeded("s1", "s2")(state))
        again = await planweave("resume", "g1", *model, *flags, cwd=tmp_path, log=log)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and sorted(report["steps"]) == ["s1", "s2", "s3", "s4"], report
    assert all(s["status"] == "succeeded" for s in report["steps"].values()), report
    assert sorted(log.read_text().split()) == ["s1", "s2", "s3", "s4"]
    assert len(planner) == 3


async def test_a_goal_run_killed_before_its_planner_wrote_a_line_plans_on_resume(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planner: list[RecordedRequest] = []

    def script(req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "all four"}))
        planner.append(req)
        return Stall(after='{"id": "s1"', seconds=None) if len(planner) == 1 else Text(plan_lines(PLAN))

    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(script) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "four marks", "--run-id", "g1", *model, *flags, cwd=tmp_path,
                               log=log)
        for _ in range(600):  # until the planner's stream has begun (the first request reached the model)
            if planner:
                break
            await asyncio.sleep(0.05)
        await kill_when(proc, url, "g1", lambda state: not state.records)
        again = await planweave("resume", "g1", *model, *flags, cwd=tmp_path, log=log)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and sorted(report["steps"]) == ["s1", "s2", "s3", "s4"], report
    assert sorted(log.read_text().split()) == ["s1", "s2", "s3", "s4"]
    assert len(planner) == 2 and not [m for m in planner[1].messages if m["role"] == "assistant"]


SUBTREE: dict[str, list[dict[str, Any]]] = {
    "root": [
        {"id": "mid", "tool": "plan", "args": {"goal": "mid"}},
        {"id": "top", "tool": MARK, "args": {"step": "top", "v": "${mid.answer}"}},
    ],
    "mid": [
        {"id": "m1", "tool": MARK, "args": {"step": "m1"}},
        {"id": "leaf", "tool": "plan", "args": {"goal": "leaf"}, "after": ["m1"]},
        {"id": "m2", "tool": MARK, "args": {"step": "m2"}},
    ],
    "leaf": [
        {"id": "l1", "tool": MARK, "args": {"step": "l1"}},
        {"id": "l2", "tool": MARK, "args": {"step": "l2"}},
        {"id": "l3", "tool": MARK, "args": {"step": "l3"}, "after": ["l1", "l2"]},
    ],
}


async def test_a_sub_plan_killed_while_its_planner_streams_resumes_by_finishing_its_plan(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planned = world(SUBTREE)
    mid_plans: list[RecordedRequest] = []

    def script(req: RecordedRequest) -> Reply:
        text = str(req.messages[-1]["content"])
        if goal_of(req) == "mid" and JOINER not in text:
            mid_plans.append(req)
            if len(mid_plans) == 1:  # the child's planner writes m1, then stalls until the process is killed
                return Stall(after=plan_lines(SUBTREE["mid"][:1]), seconds=None)
        return planned(req)  # asked again, it restates its whole plan: m1 is kept as it is, not run again

    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(script) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "root", "--run-id", "root", *model, *flags, cwd=tmp_path, log=log)
        await kill_when(proc, url, "root.mid", succeeded("m1"))
        assert log.read_text().split() == ["m1"]
        again = await planweave("resume", "root", *model, *flags, cwd=tmp_path, log=log)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["answer"] == "root answer", report
    assert sorted(log.read_text().split()) == ["l1", "l2", "l3", "m1", "m2", "top"]  # each once
    async with open_journal(url) as journal:
        got = {rid: RunState.from_events(rid, await journal.read(rid)) for rid in ("root.mid", "root.mid.leaf")}
    assert got["root.mid"].status == "succeeded" and sorted(got["root.mid"].records) == ["leaf", "m1", "m2"]
    assert all(r.status == "succeeded" for r in got["root.mid"].records.values())
    assert got["root.mid.leaf"].status == "succeeded" and sorted(got["root.mid.leaf"].records) == ["l1", "l2", "l3"]
    assert got["root.mid"].records["m1"].attempts == 1


async def test_a_goal_run_killed_while_it_re_plans_on_an_observation_re_plans_on_resume(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planner: list[RecordedRequest] = []

    def script(req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "observed"}))
        planner.append(req)
        if len(planner) == 1:
            return Text(plan_lines([{"id": "o1", "tool": MARK, "args": {"step": "o1"}, "observe": True}]))
        if len(planner) == 2:  # the re-plan on o1's result: stalls until the process is killed
            return Stall(seconds=None)
        return Text(plan_lines([{"id": "s2", "tool": MARK, "args": {"step": "s2", "v": "${o1.step}"}}]))

    flags = ("--journal", url, "--tools", "subplan_tools:toolbox", "--json")
    async with ScriptedLLM(script) as base_url:
        model = ("--model", "scripted", "--base-url", base_url)
        proc = await planweave("goal", "observe, then act", "--run-id", "g1", *model, *flags, cwd=tmp_path,
                               log=log)
        await kill_when(proc, url, "g1", lambda state: len(planner) == 2 and succeeded("o1")(state))
        again = await planweave("resume", "g1", *model, *flags, cwd=tmp_path, log=log)
        out, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["status"] == "succeeded" and sorted(report["steps"]) == ["o1", "s2"], report
    assert all(s["status"] == "succeeded" for s in report["steps"].values()), report
    assert sorted(log.read_text().split()) == ["o1", "s2"]
    assert len(planner) == 3 and "observation 'o1' arrived" in str(planner[2].messages[-1]["content"])
