"""A goal run whose model cannot be reached (connection refused, a key refused or missing) ends ``failed``, saying
what to set: from `planweave run --goal` (a real process; exit 1, stderr, --json) and over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from planweave import open_engine
from planweave.server.app import create_app
from planweave.server.limits import open_server_model
from planweave.server.live import LiveServer
from planweave.testing.scripted_llm import HttpError, RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.test_goal_and_mcp import planweave
from tests.server.conftest import TOKEN, Live


def closed_port_url() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def needs_key(req: RecordedRequest) -> Reply:
    """A server that requires a bearer key, like a hosted API."""
    if req.headers.get("authorization") != "Bearer sk-good":
        return HttpError(401, "Incorrect API key provided")
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {}}]))


def without_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}


async def run_goal(tmp_path: Path, base_url: str, *, json_out: bool, env: dict[str, str]) -> tuple[int, str, str]:
    args = ["goal", "x", "--model", "m", "--base-url", base_url, "--journal",
            f"sqlite:///{tmp_path / 'runs.db'}", *(["--json"] if json_out else [])]
    return await planweave(*args, cwd=tmp_path, env=env)


async def test_a_closed_port_fails_the_goal_run_naming_the_url(tmp_path: Path) -> None:
    url = closed_port_url()
    code, out, err = await run_goal(tmp_path, url, json_out=True, env={"OPENAI_API_KEY": "sk-test"})
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "failed"
    assert url in report["error"] and "--base-url" in report["error"]
    assert "sk-test" not in out + err
    code, out, err = await run_goal(tmp_path, url, json_out=False, env={"OPENAI_API_KEY": "sk-test"})
    assert code == 1 and "failed" in err and url in err and "--base-url" in err


async def test_a_server_that_needs_a_key_fails_the_goal_run_saying_to_set_it(tmp_path: Path) -> None:
    async with ScriptedLLM(needs_key) as base_url:
        code, out, err = await planweave(
            "goal", "x", "--model", "m", "--base-url", base_url, "--journal", "memory://", "--json",
            cwd=tmp_path, env=without_key(), inherit=False)
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "failed"
    assert "HTTP 401" in report["error"] and "set OPENAI_API_KEY" in report["error"]


async def test_a_goal_posted_over_http_with_an_unreachable_model_ends_failed(tmp_path: Path) -> None:
    url = closed_port_url()
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(open_engine(f"sqlite:///{tmp_path / 'runs.db'}"))
        model = await open_server_model(stack, engine, "m", url)
        server = await stack.enter_async_context(
            LiveServer(create_app(engine, TOKEN, model=model), "127.0.0.1", 0, log_config=None))
        async with Live(server, engine, "").client() as client:
            accepted = await client.post("/runs", json={"goal": "anything"})
            assert accepted.status_code == 201, accepted.text
            report: dict[str, Any] = {}
            for _ in range(400):
                report = (await client.get(f"/runs/{accepted.json()['run_id']}")).json()
                if report["status"] != "running":
                    break
                await asyncio.sleep(0.05)
    assert report["status"] == "failed"
    assert url in report["error"] and "--base-url" in report["error"]
