"""``planweave mcp`` spawned by the SDK's stdio client, on a SQLite journal: a plan started, waited for and read; a
goal planned offline (``--model scripted:...``, docs/offline.md); the runs stay in the journal for the next
session; nothing a client receives holds the planted secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
PLANWEAVE = str(Path(sys.executable).parent / "planweave")
SECRET = "sk-stdio-planted-0123456789abcdef"
WEATHER = "scripted:examples/offline/weather.yaml"
GOAL = "Compare tomorrow's weather in Paris and Rome and recommend one"


@asynccontextmanager
async def stdio_session(journal: Path, *flags: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A client of a fresh ``planweave mcp`` process on ``journal``, and the list every response is added to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_", "OPENAI_"))}
    env["OPENAI_API_KEY"] = SECRET
    params = StdioServerParameters(command=PLANWEAVE, args=["mcp", "--journal", f"sqlite:///{journal}", *flags],
                                   env=env, cwd=str(REPO))
    seen: list[str] = []
    async with Client(params) as client:

        async def call(name: str, args: dict[str, Any]) -> Any:
            async def progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(f"{progress} {total} {message}")

            result = await client.call_tool(name, args, progress_callback=progress)
            seen.append(result.model_dump_json())
            return result

        yield call, seen


def journal_bytes(folder: Path) -> bytes:
    """Every byte of the SQLite journal in ``folder`` (the database and its WAL)."""
    return b"".join(p.read_bytes() for p in folder.glob("runs.db*"))


async def test_a_plan_started_over_stdio_is_waited_for_and_its_outputs_read(tmp_path: Path) -> None:
    journal = tmp_path / "runs.db"
    plan = {"steps": [{"id": "a", "tool": "noop", "args": {"token": SECRET, "n": 1}},
                      {"id": "b", "tool": "noop", "args": {"from_a": "${a.n}"}, "after": ["a"]}]}
    async with stdio_session(journal) as (call, seen):
        started = await call("start_plan", {"plan": plan, "run_id": "over-stdio"})
        done = (await call("wait_run", {"run_id": "over-stdio", "timeout_s": 30})).structured_content
        step = (await call("get_step", {"run_id": "over-stdio", "step": "a"})).structured_content
    assert started.structured_content == {"run_id": "over-stdio", "status": "running"}
    assert done["task_status"] == "completed" and done["outputs"]["b"] == {"from_a": 1}
    assert step["args"]["token"].startswith("***") and SECRET not in str(step)  # hidden, as GET shows it
    raw = journal_bytes(tmp_path)
    assert SECRET.encode() not in raw and b"***$OPENAI_API_KEY#" in raw  # sealed in the journal, for a resume
    async with stdio_session(journal) as (call, again):  # the journal keeps it for the next session
        listed = (await call("list_runs", {})).structured_content
        report = (await call("get_run", {"run_id": "over-stdio"})).structured_content
    assert [r["run_id"] for r in listed["runs"]] == ["over-stdio"]
    assert report["status"] == "succeeded" and report["outputs"] == done["outputs"]
    assert not [text for text in seen + again if SECRET in text]


async def test_a_goal_planned_offline_with_a_scripted_model_over_stdio(tmp_path: Path) -> None:
    async with stdio_session(tmp_path / "runs.db", "--tools", "examples.weather:toolbox", "--model", WEATHER) \
            as (call, seen):
        wrong = await call("start_goal", {"goal": GOAL, "model": "gpt-4o"})
        done = (await call("start_goal", {"goal": GOAL, "model": WEATHER, "run_id": "weather", "budget_tokens": 50000,
                                          "wait_s": 60})).structured_content
    assert wrong.is_error and WEATHER in wrong.content[0].text
    assert done["task_status"] == "completed", done
    assert done["answer"].startswith("Go with the recommendation of step pick")
    assert set(done["outputs"]) == {"paris", "rome", "pick"}
    assert any(" of 3 steps ended" in text for text in seen)  # progress notifications reached the client
    assert not [text for text in seen if SECRET in text]


def test_malformed_requests_get_json_rpc_errors_and_the_server_serves_on(tmp_path: Path) -> None:
    """Raw JSON-RPC on the process's stdin: each bad request is answered with an error (a line that is not JSON
    has no id to answer), none ends the server, and what it answers holds no secret."""
    requests = [
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 5}},
        {"jsonrpc": "2.0", "id": 3, "method": "no/such/method", "params": {}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "get_run", "arguments": [SECRET]}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "get_run",
                                                                     "arguments": {"run_id": SECRET}}},
        {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "list_runs", "arguments": {}}},
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_", "OPENAI_"))}
    env["OPENAI_API_KEY"] = SECRET
    with subprocess.Popen([PLANWEAVE, "mcp", "--journal", f"sqlite:///{tmp_path / 'runs.db'}"], env=env, cwd=REPO,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:

            def send(line: str) -> None:
                assert proc.stdin is not None
                proc.stdin.write(line + "\n")
                proc.stdin.flush()

            send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
            shown = [proc.stdout.readline()]
            send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            send("this is not json {")
            answers: dict[int, dict[str, Any]] = {}
            for request in requests:
                send(json.dumps(request))
                shown.append(proc.stdout.readline())
                answers[request["id"]] = json.loads(shown[-1])  # type: ignore[index]  # the ids are ints
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:  # a failed read: never left behind
                proc.kill()
    assert answers[2]["error"]["code"] == -32602 and answers[3]["error"]["code"] == -32601
    assert answers[4]["error"]["code"] == -32602
    assert answers[5]["result"]["isError"] is True and "no run '***'" in answers[5]["result"]["content"][0]["text"]
    assert answers[6]["result"]["structuredContent"] == {"runs": [], "next_cursor": None}  # still serving
    assert not [line for line in shown if SECRET in line]
