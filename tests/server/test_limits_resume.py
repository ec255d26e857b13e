"""A run's limits survive a server restart: recovery re-binds its llm steps within what is left of its budget and
cancels it at the deadline it was given."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from planweave import open_engine
from planweave.server.app import create_app
from planweave.server.limits import LimitCaps, open_server_model
from planweave.server.live import LiveServer
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from tests.server.conftest import TOKEN, Live, RunTracker

# Every model call costs 500 tokens, whatever it asks: one fits a budget of 550, a second does not.
SPENDY = Text("fine", completion_tokens=500)
LLM_GATE_LLM = {"steps": [
    {"id": "first", "tool": "llm", "args": {"prompt": "a", "max_tokens": 100}},
    {"id": "gate", "tool": "sleep", "args": {"seconds": 1.0}, "after": ["first"]},
    {"id": "second", "tool": "llm", "args": {"prompt": "b", "max_tokens": 100}, "after": ["gate"]},
]}
SLOW_AFTER_GATE = {"steps": [
    {"id": "gate", "tool": "sleep", "args": {"seconds": 0.3}},
    {"id": "slow", "tool": "sleep", "args": {"seconds": 30}, "after": ["gate"]},
]}


def spendy(_req: RecordedRequest) -> Reply:
    return SPENDY


@asynccontextmanager
async def serving(journal_url: str, *, model: bool) -> AsyncIterator[Live]:
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(ScriptedLLM(spendy)) if model else None
        engine = await stack.enter_async_context(open_engine(journal_url))
        tracker = RunTracker(engine)  # before the app: its recovery resumes runs
        server_model = await open_server_model(stack, engine, "scripted", base_url) if base_url else None
        app = create_app(engine, TOKEN, recover=True, model=server_model, caps=LimitCaps())
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        yield Live(server, engine, journal_url, TOKEN, tracker)


async def step_status(client: httpx.AsyncClient, run_id: str, step: str, wanted: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for _ in range(400):
        report = (await client.get(f"/runs/{run_id}")).json()
        if report["steps"][step]["status"] == wanted:
            return report
        await asyncio.sleep(0.025)
    raise AssertionError(f"step {step} of run {run_id} never {wanted}: {report}")


async def test_a_restart_resumes_a_plans_llm_steps_within_what_is_left_of_its_budget(journal_url: str) -> None:
    async with serving(journal_url, model=True) as first, first.client() as client:
        created = await client.post("/runs", json={"plan": LLM_GATE_LLM, "budget_tokens": 550})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await step_status(client, run_id, "first", "succeeded")  # 500 of 550 tokens spent; stop during the gate
    async with serving(journal_url, model=True) as second:
        assert second.server.recovered == [run_id]  # llm is bound at recovery
        result = await asyncio.wait_for(second.wait(run_id), 20)
        events = await second.journal_events(run_id)
    assert not result.ok
    assert result.state.records["gate"].status == "succeeded"
    error = str(result.state.records["second"].error)
    assert "budget exceeded" in error and "of 550" in error, error
    spent = int(error.split(" spent")[0].rsplit(" ", 1)[1])
    assert spent >= 500  # what the first process spent counts
    limits = events[0].data["options"]["limits"]
    assert limits["budget_tokens"] == 550 and limits["model"] == "scripted"


async def test_a_restart_keeps_the_deadline_a_plan_was_posted_with(journal_url: str) -> None:
    async with serving(journal_url, model=False) as first, first.client() as client:
        created = await client.post("/runs", json={"plan": SLOW_AFTER_GATE, "deadline": 1.5})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
    async with serving(journal_url, model=False) as second:
        assert second.server.recovered == [run_id]
        result = await asyncio.wait_for(second.wait(run_id), 20)  # not the 30 s of 'slow'
    assert result.state.status == "cancelled"
    assert "deadline" in str(result.error)
    assert result.state.records["slow"].status == "cancelled"
    created_at, finished_at = result.state.created_at, result.state.finished_at
    assert created_at is not None and finished_at is not None
    assert 1.4 <= finished_at - created_at < 5  # the original deadline, not a fresh 1.5 s from the restart
