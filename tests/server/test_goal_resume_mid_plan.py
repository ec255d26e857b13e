"""A ``planweave serve`` process SIGKILLed while a POSTed goal's planner streams: the restarted server's recovery
finishes the plan (the planner asked again, shown what it had written) and runs its steps before the joiner answers,
instead of reporting the run ``succeeded`` with the steps it had so far. Real server processes on SQLite, the
scripted model server of this process; every tool call appends its step id to a file (tests/cli/subplan_tools.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from planweave import open_journal
from planweave.core.state import RunState
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Stall, Text, plan_lines
from tests.cli.test_goal_resume_mid_plan import JOINER, PLAN
from tests.server.conftest import TOKEN
from tests.server.test_limits import finished_over_http

TOOLS = Path(__file__).resolve().parents[1] / "cli"  # subplan_tools: mark_idempotent


@asynccontextmanager
async def serving(tmp_path: Path, url: str, base_url: str, log: Path,
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, httpx.AsyncClient]]:
    """``planweave serve --model scripted`` on ``url``, with a client for it; killed on leaving if still alive."""
    env = {**{k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}, "PLANWEAVE_TOKEN": TOKEN,
           "OPENAI_API_KEY": "sk-x", "SUBPLAN_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(p for p in (str(TOOLS), os.environ.get("PYTHONPATH", "")) if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal", url, "--model", "scripted",
        "--base-url", base_url, "--tools", "subplan_tools:toolbox", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        served = re.search(r"serving (http://\S+)", first)
        assert served is not None, first
        async with httpx.AsyncClient(base_url=served.group(1), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            yield proc, client
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_server_killed_while_a_goal_streams_finishes_its_plan_after_the_restart(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "calls.log"
    planner: list[RecordedRequest] = []

    def script(req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "all four"}))
        planner.append(req)
        if len(planner) == 1:  # two lines and half of the third, then nothing until the server is killed
            return Stall(after=plan_lines(PLAN[:2]) + '{"id": "s3", "tool"', seconds=None)
        return Text(plan_lines(PLAN[2:]))

    async with ScriptedLLM(script) as base_url:
        async with serving(tmp_path, url, base_url, log) as (first, client):
            created = await client.post("/runs", json={"goal": "four marks"})
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            for _ in range(600):  # until s1 and s2 ran, while the planner still streams: then kill -9
                async with open_journal(url) as journal:
                    state = RunState.from_events(run_id, await journal.read(run_id))
                if all(s in state.records and state.records[s].status == "succeeded" for s in ("s1", "s2")):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"s1 and s2 never both succeeded: {state.records}")
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert sorted(log.read_text().split()) == ["s1", "s2"]
        async with serving(tmp_path, url, base_url, log) as (_second, client):
            report = await finished_over_http(client, run_id)
    assert report["status"] == "succeeded" and report["answer"] == "all four", report
    assert sorted(report["steps"]) == ["s1", "s2", "s3", "s4"], report
    assert all(s["status"] == "succeeded" for s in report["steps"].values()), report
    assert sorted(log.read_text().split()) == ["s1", "s2", "s3", "s4"]  # s1, s2 not run again
    assert len(planner) == 2
