"""The runtime's modes over every dialect (issue 29, section 3): Chat Completions, the Responses API and Anthropic
Messages pass the same scenarios against the scripted server — admission limits hold for parallel ``llm`` steps,
``model: auto`` allocates over a tier table of the dialect's models, a model predictor of the dialect speculates,
a draft planner of the dialect plans ahead, and a budget in tokens or dollars stops a run within its cap.

Fixtures (model names, paths, the client opener, database prices) come from :mod:`test_dialect_conformance`."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.allocate import AllocationSeam, Allocator, TierProfile, TierTable
from planweave.core.clock import RealClock
from planweave.core.events import Event
from planweave.core.plan.model import SpeculationSpec
from planweave.engine.runtime import Engine, RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models import Budget, ModelClient, client_class, split_model
from planweave.models.admission import load_model_limits
from planweave.models.openai import reset_server_compat
from planweave.models.predictor import ModelPredictor
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing import Congestion, RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.llm import llm_tool
from tests.models.test_dialect_conformance import FAST, MODELS, PATHS, database_cost
from tests.timing import on_virtual_clock

# each dialect's cheaper and stronger model (both in the price database)
LARGE = {"chat": "openai:gpt-4o", "responses": "openai-responses:gpt-4o",
         "anthropic": "anthropic:claude-3-5-sonnet-latest"}

pytestmark = pytest.mark.parametrize("dialect", list(MODELS))


@pytest.fixture(autouse=True)
def _fresh_compat() -> Any:
    reset_server_compat()
    yield
    reset_server_compat()


def bare(name: str) -> str:
    return split_model(name)[1]


def opened(stack: AsyncExitStack, name: str, base_url: str, **options: Any) -> Any:
    """Open a client of ``name``'s dialect at ``base_url`` on ``stack``."""
    return stack.enter_async_context(client_class(name)(name, base_url=base_url, api_key="k", backoff=FAST,
                                                        **options))


def model_calls(events: Sequence[Event]) -> list[Event]:
    return [e for e in events if e.kind == "model_call"]


# -- 1. admission: a model limits file's concurrency holds for parallel llm steps of the dialect ----------------------
async def test_a_model_limits_files_concurrency_holds_for_parallel_llm_steps(dialect: str, tmp_path: Path) -> None:
    name = MODELS[dialect]
    limits = tmp_path / "limits.yaml"
    limits.write_text(f"'{name}': {{max_concurrency: 1, adaptive: false}}\n'*': {{max_concurrency: 16}}\n")
    admission = load_model_limits(limits)
    # past one call in flight the server answers 429 at once: any breach of the limit shows as a 429
    server = ScriptedLLM(default=Text("fine, thanks"), ttft=0.05, congestion=Congestion(knee=1, hard_limit=1,
                                                                                        retry_after=None))
    steps = [{"id": f"s{i}", "tool": "llm", "args": {"prompt": f"hello {i}", "max_tokens": 8}} for i in range(4)]
    async with server as base_url, AsyncExitStack() as stack:
        client = await opened(stack, name, base_url, admission=admission)
        engine = await stack.enter_async_context(open_engine(MemoryJournal(), tools=Toolbox({"llm": llm_tool(client)}),
                                                             concurrency=4))
        result = await (await engine.start({"steps": steps})).wait()
    assert result.ok, result.error
    assert {r.path for r in server.requests} == {PATHS[dialect]}
    assert [c.status for c in server.served] == [200] * 4, "the server refused a call: the limit was exceeded"
    assert max(c.concurrency for c in server.served) == 1
    [stats] = admission.stats()
    assert stats.admitted == 4 and stats.wait_max > 0  # the steps really queued for the one slot


# -- 2. allocation: model auto over a tier table of the dialect's models -------------------------------------------
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


async def test_model_auto_allocates_a_tier_of_the_dialect_and_prices_its_call(dialect: str, tmp_path: Path) -> None:
    small, large = MODELS[dialect], LARGE[dialect]
    tiers = TierTable({
        "small": TierProfile("small", small, p_success=0.5, duration_s=10.0, cost_usd=0.0001),
        "large": TierProfile("large", large, p_success=0.99, duration_s=15.0, cost_usd=0.001),
    })
    server = ScriptedLLM(lambda req: Text('{"answer": "ok"}', prompt_tokens=20, completion_tokens=5))
    step = {"id": "a", "tool": "llm", "retries": 2,
            "args": {"prompt": "a?", "model": "auto", "tiers": ["small", "large"], "schema": SCHEMA,
                     "max_tokens": 50}}
    async with server as base_url, AsyncExitStack() as stack:
        client = await opened(stack, small, base_url)
        # 18 s of deadline (the allocator's declared seconds): small's retry (10 + 10 s) does not fit, large does
        seam = AllocationSeam(tiers, allocator=Allocator(tiers, sims=200), deadline_at=RealClock().now() + 18.0)
        engine = await stack.enter_async_context(open_engine(
            MemoryJournal(), tools=Toolbox({"llm": llm_tool(client, allocation=seam)})))
        seam.bind(engine.get)
        run = await engine.start({"steps": [step]})
        result = await run.wait()
        events = await engine.journal.read(run.id)
    assert result.ok, result.error
    (decision,) = [e for e in events if e.kind == "allocation"]
    assert decision.step == "a" and decision.data["tier"] == "large"
    assert [(r.path, r.body["model"]) for r in server.requests] == [(PATHS[dialect], bare(large))]
    (call,) = model_calls(events)
    served = server.served[0]
    assert call.data["cost_usd"] == pytest.approx(database_cost(large, served.prompt_tokens, served.completion_tokens))
    assert result.outputs["a"]["json"] == {"answer": "ok"}


# -- 3. speculation: a model predictor of the dialect -------------------------------------------------------------
def reply_to(prompt: str) -> str:
    return "answer " + hashlib.sha256(prompt.encode()).hexdigest()[:12]


def predictor_model(right: bool) -> Callable[[RecordedRequest], Text]:
    def answer(req: RecordedRequest) -> Text:
        asked = str(req.messages[-1]["content"]).split("PROMPT:\n", 1)[-1]
        return Text(reply_to(asked) if right else "no idea")
    return answer


SPECULATED = {"steps": [
    {"id": "a", "tool": "llm", "args": {"prompt": "name a colour", "max_tokens": 16}},
    {"id": "b", "tool": "llm", "args": {"prompt": "a poem about ${a.text}", "max_tokens": 16}},
]}


async def speculate(dialect: str, mode: str, right: bool) -> tuple[dict[str, Any], list[Event], ScriptedLLM]:
    main = ScriptedLLM(lambda req: Text(reply_to(str(req.messages[-1]["content"]))), ttft=0.25)
    cheap = ScriptedLLM(predictor_model(right), ttft=0.02)
    journal = MemoryJournal()
    async with main as main_url, cheap as cheap_url, AsyncExitStack() as stack:
        client = await opened(stack, MODELS[dialect], main_url)
        small = await opened(stack, MODELS[dialect], cheap_url)
        engine = await stack.enter_async_context(open_engine(journal, tools=Toolbox({"llm": llm_tool(client)}),
                                                             concurrency=4))
        policy = SpeculationSpec(mode=mode, max_extra_cost_usd=0.01)
        started = await engine.start(SPECULATED, speculation=policy, predictor=ModelPredictor(small))
        result = await started.wait()
        assert result.ok, result.error
        return dict(result.outputs), list(await journal.read(started.id)), cheap


@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
async def test_a_model_predictor_of_the_dialect_is_adopted_or_discarded_and_outputs_match(dialect: str,
                                                                                        right: bool) -> None:
    off, _, _ = await speculate(dialect, "off", True)
    on, events, cheap = await speculate(dialect, "safe", right)
    assert on == off
    assert [(e.step, dict(e.data["basis"])) for e in events if e.kind == "speculation_started"] == [
        ("b", {"a": "model"})]
    if right:
        assert [e.step for e in events if e.kind == "speculation_adopted"] == ["b"]
    else:
        assert [e.data["reason"] for e in events if e.kind == "speculation_discarded"] == ["mismatch: a"]
    assert [r.path for r in cheap.requests] == [PATHS[dialect]]  # the prediction was asked in the dialect
    (predicted,) = [e for e in model_calls(events) if e.data.get("purpose") == "predict"]
    assert predicted.step == "a" and predicted.data["cost_usd"] > 0  # priced from the database


# -- 4. draft planning: a draft model of the dialect ---------------------------------------------------------------
GOAL = "compare the weather in Paris and Rome"
PLAN = [
    {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
    {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
    {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
]


def planner_script(draft_model: str) -> Callable[[RecordedRequest], Reply]:
    def reply(req: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in req.messages)
        if req.body.get("model") == draft_model:
            return Text(plan_lines(PLAN), ttft=0.1, tokens_per_second=300)
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "Rome is warmer"}))
        return Text(plan_lines(PLAN), ttft=1.0, tokens_per_second=30)
    return reply


async def plan_goal(dialect: str, draft: bool) -> tuple[RunResult, ScriptedLLM, list[str]]:
    clock = VirtualClock()
    fetched: list[str] = []
    tools = builtin_tools()

    async def fetch(city: str) -> dict[str, Any]:
        """Fetch the weather of a city."""
        fetched.append(city)
        await asyncio.sleep(0.5)
        return {"city": city, "temp": len(city) * 3}

    tools.add(fetch, idempotent=True)
    main_name, draft_name = LARGE[dialect], MODELS[dialect]
    server = ScriptedLLM(planner_script(bare(draft_name)))
    async with server as base_url, AsyncExitStack() as stack:
        client = await opened(stack, main_name, base_url)
        drafter: ModelClient | None = await opened(stack, draft_name, base_url) if draft else None
        engine = await stack.enter_async_context(Engine(MemoryJournal(), tools=tools, clock=clock))
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions(draft=drafter))
        result = await asyncio.wait_for(loop.run(GOAL), 60)
    return result, server, fetched


@on_virtual_clock
async def test_a_draft_model_of_the_dialect_plans_ahead_and_the_result_is_the_plain_runs(dialect: str) -> None:
    plain, _, plain_fetched = await plan_goal(dialect, draft=False)
    result, server, fetched = await plan_goal(dialect, draft=True)
    assert plain.ok and result.ok, (plain.error, result.error)
    assert result.outputs == plain.outputs and result.state.answer == plain.state.answer
    assert sorted(fetched) == sorted(plain_fetched) == ["Paris", "Rome"]  # adopted, not run twice
    assert [(s["step"], s["outcome"]) for s in result.state.speculations] == [
        ("paris", "adopted"), ("rome", "adopted"), ("pick", "adopted")]
    assert [c["purpose"] for c in result.state.model_calls] == ["draft", "plan", "join"]
    assert {r.path for r in server.requests} == {PATHS[dialect]}
    assert {r.body["model"] for r in server.requests} == {bare(LARGE[dialect]), bare(MODELS[dialect])}
    assert all(c["cost_usd"] and c["cost_usd"] > 0 for c in result.state.model_calls)


# -- 5. a budget in tokens and in dollars stops a run of the dialect within its cap ----------------------------------
REPLY = "Blue, like the sky over the sea on a clear and quiet summer morning."
CHAIN = {"steps": [{"id": f"t{i}", "tool": "llm", "args": {"prompt": f"Say something about topic {i}.",
                                                           "max_tokens": 40}} for i in range(8)]}


async def run_under(dialect: str, budget: Budget) -> tuple[RunResult, ScriptedLLM]:
    server = ScriptedLLM(default=Text(REPLY))
    async with server as base_url, AsyncExitStack() as stack:
        client = await opened(stack, MODELS[dialect], base_url)
        engine = await stack.enter_async_context(open_engine(
            MemoryJournal(), tools=Toolbox({"llm": llm_tool(client, budget)}), concurrency=2))
        result = await (await engine.start(CHAIN)).wait()
    return result, server


@pytest.mark.parametrize("unit", ["tokens", "usd"])
async def test_a_budget_stops_a_run_of_the_dialect_within_its_cap(dialect: str, unit: str) -> None:
    # a call's worst case is its prompt and 40 tokens: the cap holds a few calls' worth, not eight
    worst_usd = database_cost(MODELS[dialect], 20, 40)
    cap: Mapping[str, Any] = {"tokens": 150} if unit == "tokens" else {"usd": 3.5 * worst_usd}
    budget = Budget(**cap)
    result, server = await run_under(dialect, budget)
    assert result.status == "failed" and "budget" in (result.error or "").lower(), result.error
    served = [c for c in server.served if c.status == 200]
    assert 1 <= len(served) < len(CHAIN["steps"])
    assert {r.path for r in server.requests} == {PATHS[dialect]}
    tokens = sum(c.prompt_tokens + c.completion_tokens for c in served)
    usd = sum(database_cost(MODELS[dialect], c.prompt_tokens, c.completion_tokens) for c in served)
    assert budget.spent_tokens == tokens and budget.spent_usd == pytest.approx(usd, rel=1e-6)
    if unit == "tokens":
        assert tokens <= 150
    else:
        assert usd <= cap["usd"]
    assert budget.reserved_tokens == 0 and budget.reserved_usd == 0
