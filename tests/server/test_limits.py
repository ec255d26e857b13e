"""Limits for every run over HTTP: `POST /runs` budgets, deadline and re-plans, bounded by the server's caps."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from planweave.server.limits import LimitCaps
from planweave.server.live import ServerError
from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.server.conftest import TOKEN, start_live

SLOW_PLAN = {"steps": [{"id": "slow", "tool": "sleep", "args": {"seconds": 3}}]}
LLM_PLAN = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "say something long", "max_tokens": 500}}]}


def goal_script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "done"}))
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}}]))


async def test_a_plan_posted_with_a_deadline_is_cancelled_when_it_passes(journal_url: str) -> None:
    async with start_live(journal_url) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": SLOW_PLAN, "deadline": 0.2})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "cancelled"
    assert report["error"] == "deadline of 0.2s reached"
    assert report["steps"]["slow"]["status"] == "cancelled"


async def test_a_request_above_a_cap_is_refused_naming_the_cap(journal_url: str) -> None:
    caps = LimitCaps(budget_usd=1.0, budget_tokens=1000, deadline=60, max_replans=2)
    async with start_live(journal_url, caps=caps, model=goal_script) as live, live.client() as client:
        refused = await client.post("/runs", json={"goal": "g", "deadline": 120, "budget_tokens": 5000,
                                                   "max_replans": 3, "budget_usd": 0.5})
        listed = await client.get("/runs")
    assert refused.status_code == 422
    problems = {p["field"]: p["message"] for p in refused.json()["problems"]}
    assert problems == {
        "deadline": "120 is above this server's cap of 60 (planweave serve --max-deadline)",
        "budget_tokens": "5000 is above this server's cap of 1000 (planweave serve --max-budget-tokens)",
        "max_replans": "3 is above this server's cap of 2 (planweave serve --max-replans)",
    }
    assert listed.json() == []


async def test_a_plan_without_a_deadline_gets_the_servers_cap(journal_url: str) -> None:
    async with start_live(journal_url, caps=LimitCaps(deadline=0.2)) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": SLOW_PLAN})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "cancelled"
    assert report["error"] == "deadline of 0.2s reached"


async def test_a_goal_without_a_budget_gets_the_servers_token_cap(journal_url: str) -> None:
    async with start_live(journal_url, caps=LimitCaps(budget_tokens=10), model=goal_script) as live, \
            live.client() as client:
        accepted = await client.post("/runs", json={"goal": "do a"})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "failed"  # stopped by its budget (not cancelled)
    assert "budget" in report["error"]
    assert report["tokens"] <= 10


async def test_a_goal_within_its_limits_succeeds(journal_url: str) -> None:
    async with start_live(journal_url, caps=LimitCaps(budget_tokens=100_000, deadline=30), model=goal_script) as live, \
            live.client() as client:
        accepted = await client.post("/runs", json={"goal": "do a", "budget_tokens": 50_000, "max_replans": 1})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "succeeded", report
    assert report["answer"] == "done"


async def test_the_llm_steps_of_a_posted_plan_spend_within_its_budget(journal_url: str) -> None:
    async with start_live(journal_url, model=goal_script) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": LLM_PLAN, "budget_tokens": 50})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "failed"
    step = report["steps"]["ask"]
    assert step["status"] == "failed" and "budget" in step["error"]


async def test_limits_that_do_not_apply_to_a_plan_are_refused(journal_url: str) -> None:
    async with start_live(journal_url) as live, live.client() as client:
        replans = await client.post("/runs", json={"plan": SLOW_PLAN, "max_replans": 2})
        budget = await client.post("/runs", json={"plan": SLOW_PLAN, "budget_usd": 1})
        negative = await client.post("/runs", json={"plan": SLOW_PLAN, "deadline": -1})
    assert replans.status_code == 422
    assert replans.json()["problems"][0]["field"] == "max_replans"
    assert "goals" in replans.json()["problems"][0]["message"]
    assert budget.status_code == 422
    assert budget.json()["problems"][0]["field"] == "budget_usd"
    assert "planweave serve --model" in budget.json()["problems"][0]["message"]
    assert negative.status_code == 422 and negative.json()["problems"][0]["field"] == "body.deadline"


async def test_planweave_serve_caps_apply_to_every_request(tmp_path: Path) -> None:
    env = {**os.environ, "PLANWEAVE_TOKEN": TOKEN}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal",
        f"sqlite:///{tmp_path / 'runs.db'}", "--max-deadline", "0.3", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = re.search(r"serving (http://\S+)", first)
        assert url is not None, first
        async with httpx.AsyncClient(base_url=url.group(1), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            refused = await client.post("/runs", json={"plan": SLOW_PLAN, "deadline": 5})
            accepted = await client.post("/runs", json={"plan": SLOW_PLAN})
            assert accepted.status_code == 201, accepted.text
            report = await finished_over_http(client, accepted.json()["run_id"])
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert refused.status_code == 422
    assert "--max-deadline" in refused.json()["problems"][0]["message"]
    assert report["status"] == "cancelled" and report["error"] == "deadline of 0.3s reached"


async def finished_over_http(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """Follow ``run_id``'s event stream to its end (a server in another process: no engine to wait on here), then
    return ``GET /runs/{run_id}``."""
    async with asyncio.timeout(30), client.stream("GET", f"/runs/{run_id}/events") as stream:
        async for line in stream.aiter_lines():
            if line == "event: run_finished":
                break
    body: dict[str, Any] = (await client.get(f"/runs/{run_id}")).json()
    return body


def test_a_deadline_cap_must_leave_some_time() -> None:
    with pytest.raises(ServerError, match="--max-deadline must be above 0 seconds, got 0"):
        LimitCaps(deadline=0)
