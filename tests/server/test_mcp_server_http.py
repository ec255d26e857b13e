"""``/mcp`` on a real ``planweave serve`` (127.0.0.1, SQLite journal) through the SDK's streamable HTTP client: behind
the API's bearer token (refused without it), a plan started and read, an approval answered over MCP resumes the
run, and a server killed (SIGKILL) while a client waits is restarted: the client reconnects and reads the run's
true final state. No response holds the planted secret."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[2]
TOKEN = "mcp-http-test-token"
SECRET = "sk-http-planted-0123456789abcdef"
APPROVAL_PLAN = ("steps:\n"
                 f"  - {{id: a, tool: noop, args: {{key: {SECRET}}}}}\n"
                 "  - {id: deploy, tool: noop, approval: 'Deploy?', args: {v: 1}, after: [a]}\n")


@asynccontextmanager
async def serving(journal: Path, port: int = 0) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``planweave serve`` on 127.0.0.1 with ``TOKEN``: its URL and process (SIGTERM at the end if still alive)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_", "OPENAI_"))}
    env.update(PLANWEAVE_TOKEN=TOKEN, OPENAI_API_KEY=SECRET)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", "serve", "--port", str(port), "--journal", f"sqlite:///{journal}",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        found = re.search(r"serving (http://\S+)", first)
        assert found is not None, first
        yield found.group(1).rstrip("/"), proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


@asynccontextmanager
async def mcp_session(url: str, seen: list[str], token: str | None = TOKEN,
                      progressed: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """A client session on ``url``/mcp; every response and progress message is added to ``seen``, and
    ``progressed`` is set at each progress notification."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=None)) as http, \
            Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:

        async def call(name: str, args: dict[str, Any]) -> Any:
            async def progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(f"{progress} {total} {message}")
                if progressed is not None:
                    progressed.set()

            result = await client.call_tool(name, args, progress_callback=progress)
            seen.append(result.model_dump_json())
            return result

        yield call


async def test_the_mcp_endpoint_wants_the_servers_token(tmp_path: Path) -> None:
    async with serving(tmp_path / "runs.db") as (url, _):
        async with httpx.AsyncClient() as http:
            hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            bare = await http.post(f"{url}/mcp", json=hello)
            wrong = await http.post(f"{url}/mcp", json=hello, headers={"Authorization": "Bearer nope"})
        for token in (None, "nope"):
            with pytest.raises(Exception):  # noqa: B017  # the SDK's error for a 401 is its own
                async with mcp_session(url, [], token) as call:
                    await call("list_runs", {})
        seen: list[str] = []
        async with mcp_session(url, seen) as call:
            listed = await call("list_runs", {})
    assert bare.status_code == 401 and wrong.status_code == 401
    assert bare.headers["www-authenticate"] == "Bearer" and "access token" in bare.json()["detail"]
    assert not listed.is_error and listed.structured_content == {"runs": [], "next_cursor": None}


async def test_an_approval_answered_over_mcp_resumes_the_run(tmp_path: Path) -> None:
    seen: list[str] = []
    async with serving(tmp_path / "runs.db") as (url, _), mcp_session(url, seen) as call:
        started = await call("start_plan", {"plan_yaml": APPROVAL_PLAN, "run_id": "gated", "wait_s": 30})
        approved = await call("approve_step", {"run_id": "gated", "step": "deploy", "reason": "looks right"})
        done = (await call("wait_run", {"run_id": "gated", "timeout_s": 30})).structured_content
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            over_http = (await http.get(f"{url}/runs/gated")).json()
    waiting = started.structured_content
    assert waiting["task_status"] == "input_required" and waiting["questions"][0]["prompt"] == "Deploy?"
    assert approved.structured_content == {"run_id": "gated", "step": "deploy", "outcome": "applied"}
    assert done["task_status"] == "completed" and done["outputs"]["deploy"] == {"v": 1}
    assert {k: v for k, v in done.items() if k != "task_status"} == over_http  # the one read model
    assert not [text for text in seen if SECRET in text]


async def test_a_client_waiting_through_a_killed_server_reads_the_true_final_state_after_its_restart(
        tmp_path: Path) -> None:
    journal = tmp_path / "runs.db"
    plan = {"steps": [{"id": "slow", "tool": "sleep", "args": {"seconds": 2, "result": {"slept": "well"}}},
                      {"id": "after", "tool": "noop", "args": {"got": "${slow.slept}"}, "after": ["slow"]}]}
    seen: list[str] = []
    waits = asyncio.Event()
    async with serving(journal) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(Exception):  # noqa: B017  # the connection is lost mid-call
            async with mcp_session(url, seen, progressed=waits) as call:
                await call("start_plan", {"plan": plan, "run_id": "survivor"})
                waiting = asyncio.ensure_future(call("wait_run", {"run_id": "survivor", "timeout_s": 60}))
                await asyncio.wait_for(waits.wait(), 30)  # its first progress: the server follows the run
                assert not waiting.done()
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                await asyncio.wait_for(waiting, 30)
    async with serving(journal, port) as (again, _), mcp_session(again, seen) as call:
        done = (await call("wait_run", {"run_id": "survivor", "timeout_s": 60})).structured_content
    assert done["task_status"] == "completed", done
    assert done["outputs"] == {"slow": {"slept": "well"}, "after": {"got": "well"}}
    assert [e["outcome"] for e in done["steps"]["slow"]["attempt_log"]][-1] == "succeeded"
    assert not [text for text in seen if SECRET in text]
