"""A goal run interrupted in a server and resumed there (``POST /runs/{id}/resume``, or the next server's recovery)
gets its planning loop back, rebuilt from the journal as ``planweave resume RUN --model M`` does: the joiner
answers, and no finished step runs again. A plan run resumes as before."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.server.conftest import Live, gated_tools, start_live

JOINER = "If the results answer the goal"
ANSWER = "answered after the resume"
GOAL_PLAN: list[dict[str, Any]] = [{"id": "a", "tool": "noop", "args": {"x": 1}},
             {"id": "gate", "tool": "gate", "after": ["a"]},
             {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}, "after": ["gate"]}]
PLAN = {"steps": [{"id": "a", "tool": "noop", "args": {"x": 1}},
                  {"id": "gate", "tool": "gate", "after": ["a"]},
                  {"id": "b", "tool": "noop", "after": ["gate"]}]}


class Script:
    """The planner writes ``GOAL_PLAN``; the joiner answers ``ANSWER``. Counts what each was asked."""

    def __init__(self) -> None:
        self.plans = 0
        self.joins = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        if JOINER in str(req.messages[-1]["content"]):
            self.joins += 1
            return Text(json.dumps({"answer": ANSWER}))
        self.plans += 1
        return Text(plan_lines(GOAL_PLAN))


async def _interrupted_goal(journal_url: str, script: Script, body: dict[str, object] | None = None) -> str:
    """A goal run posted to a server that stops while it waits at its closed gate, after 'a' succeeded."""
    closed = asyncio.Event()  # never opened
    async with start_live(journal_url, model=script, tools=gated_tools(closed), recover=False) as first, \
            first.client() as client:
        created = await client.post("/runs", json={"goal": "do a, pass the gate, then b", **(body or {})})
        assert created.status_code == 201, created.text
        run_id: str = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
    return run_id


async def _started(live: Live, run_id: str, step: str) -> int:
    return sum(1 for e in await live.journal_events(run_id) if e.kind == "step_started" and e.step == step)


async def test_a_goal_run_resumed_over_http_gets_its_planner_and_joiner_back(journal_url: str) -> None:
    first_script = Script()
    run_id = await _interrupted_goal(journal_url, first_script, {"context": "summary", "subplans": False})
    assert first_script.plans == 1 and first_script.joins == 0
    script = Script()
    async with start_live(journal_url, model=script, tools=gated_tools(None), recover=False) as second, \
            second.client() as client:
        resumed = await client.post(f"/runs/{run_id}/resume")
        assert resumed.status_code == 202, resumed.text
        report = await second.finished(client, run_id)
        a_started = await _started(second, run_id, "a")
        events = await second.journal_events(run_id)
    assert report["status"] == "succeeded", report
    assert report["answer"] == ANSWER
    assert script.joins == 1 and script.plans == 0  # the joiner answered; the finished plan was not planned again
    assert a_started == 1  # 'a' succeeded before the stop: not run again
    limits = events[0].data["options"]["limits"]
    assert limits["context"] == "summary" and limits["subplans"] is False and limits["origin"] == "POST /runs"


async def test_a_restarted_server_resumes_an_interrupted_goal_run_with_its_planner(journal_url: str) -> None:
    run_id = await _interrupted_goal(journal_url, Script())
    script = Script()
    async with start_live(journal_url, model=script, tools=gated_tools(None)) as second, second.client() as client:
        assert second.server.recovered == [run_id]
        report = await second.finished(client, run_id)
        a_started = await _started(second, run_id, "a")
    assert report["status"] == "succeeded", report
    assert report["answer"] == ANSWER
    assert script.joins == 1 and script.plans == 0
    assert a_started == 1


async def test_a_server_without_a_model_refuses_to_resume_a_goal_run(journal_url: str) -> None:
    run_id = await _interrupted_goal(journal_url, Script())
    async with start_live(journal_url, tools=gated_tools(None)) as second, second.client() as client:
        assert second.server.recovered == []  # logged and skipped, not resumed without its planner
        refused = await client.post(f"/runs/{run_id}/resume")
    assert refused.status_code == 422, refused.text
    assert "planweave serve --model NAME" in refused.json()["detail"]


async def test_a_plan_run_resumed_over_http_has_no_planner(journal_url: str) -> None:
    closed = asyncio.Event()
    script = Script()
    async with start_live(journal_url, model=script, tools=gated_tools(closed), recover=False) as first, \
            first.client() as client:
        created = await client.post("/runs", json={"plan": PLAN})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
    async with start_live(journal_url, model=script, tools=gated_tools(None), recover=False) as second, \
            second.client() as client:
        resumed = await client.post(f"/runs/{run_id}/resume")
        assert resumed.status_code == 202, resumed.text
        report = await second.finished(client, run_id)
        a_started = await _started(second, run_id, "a")
    assert report["status"] == "succeeded", report
    assert report.get("answer") is None
    assert script.plans == 0 and script.joins == 0
    assert a_started == 1


async def test_a_goal_run_resumed_over_http_spends_only_what_is_left_of_its_budget(journal_url: str) -> None:
    def planner(req: RecordedRequest) -> Reply:  # the plan costs 4900 of the 5000 tokens: the llm step has no room
        if JOINER in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "within budget"}))
        if "a-llm-step" in str(req.messages[-1]["content"]):
            return Text("fine", completion_tokens=4900)
        return Text(plan_lines([*GOAL_PLAN[:2], {"id": "ask", "tool": "llm", "after": ["gate"],
                                                 "args": {"prompt": "a-llm-step", "max_tokens": 100}}]),
                    completion_tokens=4900)

    closed = asyncio.Event()
    async with start_live(journal_url, model=planner, tools=gated_tools(closed), recover=False) as first, \
            first.client() as client:
        created = await client.post("/runs", json={"goal": "g", "budget_tokens": 5000, "max_replans": 0})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
    async with start_live(journal_url, model=planner, tools=gated_tools(None), recover=False) as second, \
            second.client() as client:
        resumed = await client.post(f"/runs/{run_id}/resume")
        assert resumed.status_code == 202, resumed.text
        result = await second.wait(run_id)
    error = str(result.state.records["ask"].error)
    assert result.state.records["gate"].status == "succeeded"
    assert "budget exceeded" in error and "of 5000" in error, error
