"""`POST /runs {"goal": ...}`: a server with a model plans goals; one without says how to give it one."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from planweave import open_engine
from planweave.server.app import create_app
from planweave.server.limits import open_server_model
from planweave.server.live import LiveServer
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.server.conftest import TOKEN, Live


def script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "planned over HTTP"}))
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}},
                            {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}}]))


async def test_a_goal_posted_to_runs_is_planned_with_the_servers_model(journal_url: str) -> None:
    async with ScriptedLLM(script) as base_url, contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(open_engine(journal_url))
        model = await open_server_model(stack, engine, "scripted", base_url)
        app = create_app(engine, TOKEN, model=model)
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        live = Live(server, engine, journal_url)
        async with live.client() as client:
            accepted = await client.post("/runs", json={"goal": "do a then b"})
            assert accepted.status_code == 201, accepted.text
            run_id = accepted.json()["run_id"]
            report: dict[str, Any] = {}
            for _ in range(200):
                report = (await client.get(f"/runs/{run_id}")).json()
                if report["status"] != "running":
                    break
                await asyncio.sleep(0.05)
    assert report["status"] == "succeeded"
    assert report["answer"] == "planned over HTTP"
    assert report["plan_versions"][0]["added"] == ["a", "b"]


async def test_a_server_without_a_model_refuses_goals_clearly(live: Live) -> None:
    async with live.client() as client:
        refused = await client.post("/runs", json={"goal": "anything"})
        both = await client.post("/runs", json={"goal": "x", "plan": {"steps": []}})
    assert refused.status_code == 422
    assert "planweave serve --model NAME" in refused.json()["detail"]
    assert both.status_code == 422 and "not both" in both.json()["detail"]
