"""`POST /runs {"goal": ...}`: a server with a model plans goals; one without says how to give it one."""

from __future__ import annotations

import json

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.server.conftest import Live, start_live


def script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "planned over HTTP"}))
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}},
                            {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}}]))


async def test_a_goal_posted_to_runs_is_planned_with_the_servers_model(journal_url: str) -> None:
    async with start_live(journal_url, model=script) as live, live.client() as client:
        accepted = await client.post("/runs", json={"goal": "do a then b"})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
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
