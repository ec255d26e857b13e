"""A run's limits survive a server restart: recovery re-binds its llm steps within what is left of its budget and
cancels it at the deadline it was given."""

from __future__ import annotations

import asyncio

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.conftest import gated_tools, start_live

# Every model call costs 500 tokens, whatever it asks: one fits a budget of 550, a second does not.
SPENDY = Text("fine", completion_tokens=500)
LLM_GATE_LLM = {"steps": [
    {"id": "first", "tool": "llm", "args": {"prompt": "a", "max_tokens": 100}},
    {"id": "gate", "tool": "gate", "after": ["first"]},
    {"id": "second", "tool": "llm", "args": {"prompt": "b", "max_tokens": 100}, "after": ["gate"]},
]}
SLOW_AFTER_GATE = {"steps": [
    {"id": "gate", "tool": "gate"},
    {"id": "slow", "tool": "sleep", "args": {"seconds": 30}, "after": ["gate"]},
]}


def spendy(_req: RecordedRequest) -> Reply:
    return SPENDY


async def test_a_restart_resumes_a_plans_llm_steps_within_what_is_left_of_its_budget(journal_url: str) -> None:
    closed = asyncio.Event()  # never opened: the first server stops while the run waits at the gate
    async with start_live(journal_url, model=spendy, tools=gated_tools(closed)) as first, first.client() as client:
        created = await client.post("/runs", json={"plan": LLM_GATE_LLM, "budget_tokens": 550})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")  # 'first' spent 500 of the 550 tokens
    async with start_live(journal_url, model=spendy, tools=gated_tools(None)) as second:
        assert second.server.recovered == [run_id]  # llm is bound at recovery
        result = await second.wait(run_id)
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
    closed = asyncio.Event()
    async with start_live(journal_url, tools=gated_tools(closed)) as first, first.client() as client:
        created = await client.post("/runs", json={"plan": SLOW_AFTER_GATE, "deadline": 1.5})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
    async with start_live(journal_url, tools=gated_tools(None)) as second:
        assert second.server.recovered == [run_id]
        result = await second.wait(run_id)  # not the 30 s of 'slow'
    assert result.state.status == "cancelled"
    assert "deadline" in str(result.error)
    assert result.state.records["slow"].status == "cancelled"
    created_at, finished_at = result.state.created_at, result.state.finished_at
    assert created_at is not None and finished_at is not None
    assert 1.4 <= finished_at - created_at < 5  # the original deadline, not a fresh 1.5 s from the restart


async def test_a_posted_priority_is_journaled_and_kept_by_a_restart(journal_url: str) -> None:
    closed = asyncio.Event()
    async with start_live(journal_url, tools=gated_tools(closed)) as first, first.client() as client:
        refused = await client.post("/runs", content='{"plan": {"steps": [{"id": "a", "tool": "noop"}]}, '
                                                     '"priority": Infinity}',
                                    headers={"content-type": "application/json"})
        created = await client.post("/runs", json={"plan": SLOW_AFTER_GATE, "priority": 4})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
        before = first.run(run_id).priority
    assert refused.status_code == 422 and "priority" in refused.text, refused.text
    async with start_live(journal_url, tools=gated_tools(closed)) as second:
        assert second.server.recovered == [run_id]
        after = second.run(run_id).priority
        events = await second.journal_events(run_id)
    assert before == after == 4.0
    assert events[0].data["options"]["priority"] == 4.0
