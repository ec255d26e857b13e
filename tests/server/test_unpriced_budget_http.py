"""``POST /runs`` with ``budget_usd`` over a model without a price is refused (422 naming the model) before any model
call (issue 27); a token budget runs it, its cost then shown unknown (null) by ``GET /runs/{id}``, never $0."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from planweave import open_engine
from planweave.server import LiveServer, create_app
from planweave.server.limits import open_server_model
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.server.conftest import TOKEN, Live, RunTracker

MODEL = "my-llama-70b"
LLM_PLAN = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "say hi", "max_tokens": 20}}]}
TIERS = {"small": {"model": "gpt-4o-mini", "p_success": 0.9, "duration_s": 1, "cost_usd": 0.0001},
         "large": {"model": "my-llama-405b", "p_success": 0.99, "duration_s": 2, "cost_usd": 0.001}}


def _script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "done"}))
    if "say hi" in str(req.messages[-1]["content"]):
        return Text("hi")
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}}]))


@asynccontextmanager
async def _serving(journal_url: str, model: str) -> AsyncIterator[tuple[Live, ScriptedLLM]]:
    """A real server whose model (``planweave serve --model``) is ``model`` on a scripted endpoint it records."""
    async with contextlib.AsyncExitStack() as stack:
        llm = ScriptedLLM(_script, models=(model, "gpt-4o-mini", "my-llama-405b"))
        base_url = await stack.enter_async_context(llm)
        engine = await stack.enter_async_context(open_engine(journal_url))
        tracker = RunTracker(engine)
        server_model = await open_server_model(stack, engine, model, base_url)
        app = create_app(engine, TOKEN, model=server_model)
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        yield Live(server, engine, journal_url, TOKEN, tracker), llm


async def test_a_goal_with_a_dollar_budget_on_an_unpriced_model_is_422_naming_it(journal_url: str) -> None:
    async with _serving(journal_url, MODEL) as (live, llm), live.client() as client:
        refused = await client.post("/runs", json={"goal": "do one thing", "budget_usd": 0.5})
        assert refused.status_code == 422, refused.text
        problem = refused.json()["problems"][0]
        assert problem["field"] == "budget_usd"
        assert f"'{MODEL}'" in problem["message"] and "--config prices=FILE" in problem["message"]
        assert "PLANWEAVE_PRICES" in problem["message"]
        listed = await client.get("/runs")
        assert listed.json() == []  # no run was started
    assert llm.requests == []  # refused before the planner's first call


async def test_a_plan_with_llm_steps_and_a_dollar_budget_is_422_and_one_without_runs(journal_url: str) -> None:
    async with _serving(journal_url, MODEL) as (live, llm), live.client() as client:
        refused = await client.post("/runs", json={"plan": LLM_PLAN, "budget_usd": 0.5})
        assert refused.status_code == 422, refused.text
        assert f"'{MODEL}'" in refused.json()["problems"][0]["message"]
        # A plan with no llm step calls no model: its dollar budget is the forecast's, not a model's.
        accepted = await client.post("/runs", json={"plan": {"steps": [{"id": "n", "tool": "noop", "args": {}}]},
                                                    "budget_usd": 0.5})
        assert accepted.status_code == 201, accepted.text
        await live.finished(client, accepted.json()["run_id"])
    assert llm.requests == []


async def test_tiers_under_a_dollar_budget_need_every_tier_priced(journal_url: str) -> None:
    plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "say hi", "model": "auto",
                                                            "tiers": ["small", "large"], "max_tokens": 20}}]}
    async with _serving(journal_url, "gpt-4o-mini") as (live, llm), live.client() as client:
        refused = await client.post("/runs", json={"plan": plan, "tiers": TIERS, "budget_usd": 0.5})
        assert refused.status_code == 422, refused.text
        message = refused.json()["problems"][0]["message"]
        assert "'my-llama-405b'" in message and "'gpt-4o-mini'" not in message
    assert llm.requests == []


async def test_a_token_budget_runs_an_unpriced_model_and_its_cost_is_unknown(journal_url: str) -> None:
    async with _serving(journal_url, MODEL) as (live, llm), live.client() as client:
        accepted = await client.post("/runs", json={"plan": LLM_PLAN, "budget_tokens": 10_000})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "succeeded" and report["tokens"] > 0
    assert report["cost_usd"] is None and report["unpriced_models"] == [MODEL]
    assert len(llm.requests) == 1


async def test_a_priced_model_from_the_database_takes_a_dollar_budget(journal_url: str) -> None:
    async with _serving(journal_url, "gpt-4o-mini") as (live, llm), live.client() as client:
        accepted = await client.post("/runs", json={"plan": LLM_PLAN, "budget_usd": 0.5})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
    assert report["status"] == "succeeded"
    assert report["cost_usd"] is not None and report["cost_usd"] > 0 and "unpriced_models" not in report
    assert len(llm.requests) == 1
