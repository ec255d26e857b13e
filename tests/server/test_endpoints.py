"""`POST /runs` `endpoint`: a run on another model endpoint, only one the server allows (--allow-endpoint,
--allow-key-env), its key never journaled nor shown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from planweave import Toolbox, open_engine
from planweave.models import Endpoint
from planweave.server import LiveServer, create_app
from planweave.server.endpoints import EndpointPolicy
from planweave.server.limits import open_server_model
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.safety import SecretRedactor
from tests.server.conftest import TOKEN, Live, RunTracker, gated_tools

KEY_OWN = "sk-own-0123456789abcdef"  # planted: must never reach the journal, a response or the logs
KEY_OTHER = "sk-other-0123456789abcdef"
HEADER_SECRET = "org-secret-0123456789"


def journal_bytes(directory: Path) -> bytes:
    """Every byte of the SQLite journal in ``directory`` (its WAL too)."""
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.name.startswith("runs.db"))


def answer(req: RecordedRequest) -> Reply:
    last = str(req.messages[-1]["content"])
    if "If the results answer the goal" in last:
        return Text(json.dumps({"answer": "done"}))
    if "Write the plan" in last:
        return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}}]))
    return Text(f"answer to {last}")


def ask(prompt: str) -> dict[str, Any]:
    return {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": prompt}}]}


@dataclass
class Servers:
    live: Live
    own: ScriptedLLM
    other: ScriptedLLM
    other_url: str


@contextlib.asynccontextmanager
async def serving(journal_url: str, tools: Toolbox | None = None) -> AsyncIterator[Servers]:
    own, other = ScriptedLLM(answer), ScriptedLLM(answer)
    async with own as own_url, other as other_url, server_on(journal_url, own_url, other_url, tools) as live:
        yield Servers(live, own, other, other_url)


@contextlib.asynccontextmanager
async def server_on(journal_url: str, own_url: str, other_url: str, tools: Toolbox | None = None
                    ) -> AsyncIterator[Live]:
    """``planweave serve --model scripted --base-url OWN --api-key-env PLANWEAVE_TEST_KEY_OWN --allow-endpoint
    OTHER --allow-key-env PLANWEAVE_TEST_KEY_OTHER``."""
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(open_engine(journal_url, tools=tools,
                                                             redact=SecretRedactor()))  # as serve's
        tracker = RunTracker(engine)
        endpoint = Endpoint(own_url, "PLANWEAVE_TEST_KEY_OWN")
        model = await open_server_model(stack, engine, "scripted", own_url, endpoint=endpoint,
                                        policy=EndpointPolicy.of(endpoint, [other_url], ["PLANWEAVE_TEST_KEY_OTHER"]))
        app = create_app(engine, TOKEN, model=model)
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        yield Live(server, engine, journal_url, TOKEN, tracker)


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANWEAVE_TEST_KEY_OWN", KEY_OWN)
    monkeypatch.setenv("PLANWEAVE_TEST_KEY_OTHER", KEY_OTHER)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


async def test_two_posted_runs_call_their_own_endpoints_with_their_own_keys(
        journal_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with serving(journal_url) as s, s.live.client() as client:
        posted = await asyncio.gather(
            client.post("/runs", json={"plan": ask("for the server's endpoint")}),
            client.post("/runs", json={"plan": ask(f"for the other endpoint, echo {HEADER_SECRET}"), "endpoint": {
                "base_url": s.other_url, "api_key_env": "PLANWEAVE_TEST_KEY_OTHER",
                "headers": {"X-Org": HEADER_SECRET}}}),
            client.post("/runs", json={"goal": "a goal on the other endpoint", "endpoint": {
                "base_url": s.other_url, "api_key_env": "PLANWEAVE_TEST_KEY_OTHER"}}))
        assert [p.status_code for p in posted] == [201, 201, 201], [p.text for p in posted]
        reports = [await s.live.finished(client, p.json()["run_id"]) for p in posted]
        step = (await client.get(f"/runs/{reports[1]['run_id']}/steps/ask")).text
        shown = json.dumps(reports) + (await client.get("/runs")).text + step
    assert [r["status"] for r in reports] == ["succeeded"] * 3
    own_prompts = [str(r.messages[-1]["content"]) for r in s.own.chat_requests]
    other_prompts = [str(r.messages[-1]["content"]) for r in s.other.chat_requests]
    assert own_prompts == ["for the server's endpoint"]
    assert f"for the other endpoint, echo {HEADER_SECRET}" in other_prompts
    assert len(other_prompts) >= 3  # and the goal's planner and joiner
    assert "answer to for the other endpoint, echo ***" in step  # its output, the header's value hidden
    assert {r.headers["authorization"] for r in s.own.chat_requests} == {f"Bearer {KEY_OWN}"}
    assert {r.headers["authorization"] for r in s.other.chat_requests} == {f"Bearer {KEY_OTHER}"}
    stored = journal_bytes(tmp_path)
    assert b"PLANWEAVE_TEST_KEY_OTHER" in stored
    for secret in (KEY_OWN, KEY_OTHER, HEADER_SECRET):
        assert secret.encode() not in stored
        assert secret not in shown and secret not in caplog.text


@pytest.mark.parametrize(("endpoint", "field"), [
    ({"base_url": "http://203.0.113.9/v1"}, "endpoint.base_url"),
    ({"api_key_env": "AWS_SECRET_ACCESS_KEY"}, "endpoint.api_key_env"),
    ({"api_key": KEY_OTHER}, "endpoint.api_key"),
    ({"base_url": "file:///etc/passwd"}, "endpoint.base_url"),
    ({"headers": {"Authorization": "Bearer x"}}, "endpoint.headers"),
])
async def test_an_endpoint_the_server_does_not_allow_is_refused_naming_the_field(
        journal_url: str, endpoint: dict[str, Any], field: str) -> None:
    async with serving(journal_url) as s, s.live.client() as client:
        refused = await client.post("/runs", json={"plan": ask("never sent"), "endpoint": endpoint})
        goal = await client.post("/runs", json={"goal": "never planned", "endpoint": endpoint})
        listed = await client.get("/runs")
    for response in (refused, goal):
        assert response.status_code == 422, response.text
        assert [p["field"] for p in response.json()["problems"]] == [field]
        assert KEY_OTHER not in response.text
    assert listed.json() == []
    assert s.own.chat_requests == [] and s.other.chat_requests == []


async def test_tiers_on_an_endpoint_the_server_does_not_allow_are_refused(journal_url: str) -> None:
    tiers = {"big": {"model": "big-m", "p_success": 0.9, "duration_s": 1, "cost_usd": 0,
                     "base_url": "http://203.0.113.9/v1"}}
    async with serving(journal_url) as s, s.live.client() as client:
        refused = await client.post("/runs", json={"plan": ask("never sent"), "tiers": tiers})
    assert refused.status_code == 422, refused.text
    assert [p["field"] for p in refused.json()["problems"]] == ["tiers.big.base_url"]


async def test_a_restarted_server_resumes_a_run_on_the_endpoint_it_asked_for(journal_url: str) -> None:
    plan = {"steps": [{"id": "gate", "tool": "gate"},
                      {"id": "ask", "tool": "llm", "args": {"prompt": "after the restart"}, "after": ["gate"]}]}
    own, other = ScriptedLLM(answer), ScriptedLLM(answer)
    async with own as own_url, other as other_url:
        async with server_on(journal_url, own_url, other_url, gated_tools(asyncio.Event())) as first, \
                first.client() as client:
            created = await client.post("/runs", json={"plan": plan, "endpoint": {
                "base_url": other_url, "api_key_env": "PLANWEAVE_TEST_KEY_OTHER"}})
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            await first.until_step(run_id, "gate", "running")
        async with server_on(journal_url, own_url, other_url, gated_tools(None)) as second:
            assert second.server.recovered == [run_id]
            result = await second.wait(run_id)
    assert result.ok, result.error
    assert own.chat_requests == []
    assert [r.headers["authorization"] for r in other.chat_requests] == [f"Bearer {KEY_OTHER}"]


def test_serve_refuses_an_allowed_endpoint_that_is_no_url(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", "serve", "--model", "m", "--journal",
                           f"sqlite:///{tmp_path / 'r.db'}", "--allow-endpoint", "ftp://x"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "--allow-endpoint" in done.stderr and "http(s)" in done.stderr and "Traceback" not in done.stderr
