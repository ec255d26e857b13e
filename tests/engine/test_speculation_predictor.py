"""A cheap model as speculation predictor (source ``model``): real HTTP to the scripted OpenAI-compatible server, on
the real clock (sockets): the main model answers in 0.3 s, the predictor in 0.02 s, so ``b`` starts on the prediction
well before ``a`` ends."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from planweave import Engine, Toolbox, open_engine
from planweave.core.plan.model import SpeculationSpec, Step
from planweave.journal.memory import MemoryJournal
from planweave.models.budget import Budget
from planweave.models.openai import OpenAIChatClient, reset_server_compat
from planweave.models.predictor import ModelPredictor
from planweave.testing import ScriptedLLM, Text
from planweave.testing.scripted_llm import RecordedRequest
from planweave.tools.llm import llm_tool

MODEL = "gpt-4o-mini"
PREDICT = "PROMPT:\n"


def reply_to(prompt: str) -> str:
    return "answer " + hashlib.sha256(prompt.encode()).hexdigest()[:12]


def main_model(req: RecordedRequest) -> Text:
    return Text(reply_to(str(req.messages[-1]["content"])))


def predictor_model(right: bool) -> Callable[[RecordedRequest], Text]:
    def answer(req: RecordedRequest) -> Text:
        asked = str(req.messages[-1]["content"]).split(PREDICT, 1)[-1]
        return Text(reply_to(asked) if right else "no idea")
    return answer


DOC = {"steps": [
    {"id": "a", "tool": "llm", "args": {"prompt": "name a colour", "max_tokens": 16}},
    {"id": "b", "tool": "llm", "args": {"prompt": "a poem about ${a.text}", "max_tokens": 16}},
]}


@asynccontextmanager
async def served(right: bool, concurrency: int) -> AsyncIterator[tuple[Engine, OpenAIChatClient, MemoryJournal]]:
    """An engine whose ``llm`` tool calls the main model (0.3 s), the predictor's client (0.02 s; ``right`` or not)
    and the engine's journal, until the block ends."""
    reset_server_compat()
    main = ScriptedLLM(main_model, ttft=0.3, models=(MODEL,))
    cheap = ScriptedLLM(predictor_model(right), ttft=0.02, models=(MODEL,))
    journal = MemoryJournal()
    async with main as main_url, cheap as cheap_url, \
            OpenAIChatClient(MODEL, base_url=main_url) as client, \
            OpenAIChatClient(MODEL, base_url=cheap_url) as small, \
            open_engine(journal, tools=Toolbox({"llm": llm_tool(client)}), concurrency=concurrency) as engine:
        yield engine, small, journal


async def run(mode: str, right: bool) -> tuple[dict[str, Any], list[Any]]:
    async with served(right, concurrency=4) as (engine, small, journal):
        policy = SpeculationSpec(mode="safe" if mode != "off" else "off", max_extra_cost_usd=0.01)
        started = await engine.start(DOC, speculation=policy, predictor=ModelPredictor(small))
        result = await started.wait()
        assert result.ok, result.error
        return dict(result.outputs), await journal.read(started.id)


def test_a_right_model_prediction_is_adopted_and_the_outputs_are_those_without_speculation() -> None:
    off, _ = asyncio.run(run("off", True))
    on, events = asyncio.run(run("safe", True))
    assert on == off
    started = [(e.step, dict(e.data["basis"])) for e in events if e.kind == "speculation_started"]
    assert started == [("b", {"a": "model"})]
    assert [e.step for e in events if e.kind == "speculation_adopted"] == ["b"]
    predicted = [e for e in events if e.kind == "model_call" and e.data.get("purpose") == "predict"]
    assert [e.step for e in predicted] == ["a"] and predicted[0].data["speculative"] is True


def test_a_wrong_model_prediction_is_discarded_and_costs_only_calls() -> None:
    off, _ = asyncio.run(run("off", True))
    on, events = asyncio.run(run("safe", False))
    assert on == off
    assert [e.data["reason"] for e in events if e.kind == "speculation_discarded"] == ["mismatch: a"]


# -- the cost of predictions: speculation's extra cost, capped, and inside the run's budget --------------------------
FAN = {"steps": [
    *({"id": f"a{i}", "tool": "llm", "args": {"prompt": f"colour {i}", "max_tokens": 16}} for i in range(3)),
    *({"id": f"b{i}", "tool": "llm", "args": {"prompt": "a poem about ${a" + str(i) + ".text}", "max_tokens": 16}}
      for i in range(3)),
]}


async def fan(mode: str, cap: float, budget: Budget | None = None) -> tuple[dict[str, Any], list[Any], float]:
    async with served(True, concurrency=8) as (engine, small, journal):
        predictor = ModelPredictor(small, budget=budget)
        estimate = predictor.estimate_usd(Step(id="a0", tool="llm"), {"prompt": "colour 0", "max_tokens": 16})
        policy = SpeculationSpec(mode="safe" if mode != "off" else "off", max_extra_cost_usd=cap * estimate)
        started = await engine.start(FAN, speculation=policy, predictor=predictor)
        result = await started.wait()
        assert result.ok, result.error
        return dict(result.outputs), await journal.read(started.id), estimate


def predict_calls(events: list[Any]) -> list[Any]:
    return [e for e in events if e.kind == "model_call" and e.data.get("purpose") == "predict"]


async def test_predictions_are_capped_by_max_extra_cost_and_counted() -> None:
    off, _, _ = await fan("off", 10)
    on, events, estimate = await fan("safe", 1.5)  # room for one prediction's worst case, not two
    assert on == off
    (call,) = predict_calls(events)
    assert 0 < call.data["cost_usd"] <= estimate
    assert len([e for e in events if e.kind == "speculation_adopted"]) == 1
    roomy, events, _ = await fan("safe", 10)  # all three fit
    assert roomy == off
    assert len(predict_calls(events)) == 3
    assert len([e for e in events if e.kind == "speculation_adopted"]) == 3


async def test_predictions_are_charged_to_the_runs_budget_and_not_made_without_room() -> None:
    budget = Budget(usd=1.0)
    _, events, _ = await fan("safe", 10, budget)
    spent = sum(e.data["cost_usd"] for e in predict_calls(events))
    assert len(predict_calls(events)) == 3 and spent > 0
    assert abs(budget.spent_usd - spent) < 1e-9  # the llm steps here have no budget: only predictions charged it
    empty = Budget(usd=1e-9)
    off, _, _ = await fan("off", 10)
    on, events, _ = await fan("safe", 10, empty)
    assert on == off
    assert predict_calls(events) == [] and empty.spent_usd == 0
    assert not [e for e in events if e.kind == "speculation_started"]
