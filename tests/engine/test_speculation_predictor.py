"""A cheap model as speculation predictor (source ``model``): real HTTP to the scripted OpenAI-compatible server, on
the real clock (sockets): the main model answers in 0.3 s, the predictor in 0.02 s, so ``b`` starts on the prediction
well before ``a`` ends."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

from planweave import Toolbox, open_engine
from planweave.journal.memory import MemoryJournal
from planweave.models.openai import OpenAIChatClient, reset_server_compat
from planweave.models.predictor import ModelPredictor
from planweave.plan.model import SpeculationSpec
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


async def run(mode: str, right: bool) -> tuple[dict[str, Any], list[Any]]:
    reset_server_compat()
    main = ScriptedLLM(main_model, ttft=0.3, models=(MODEL,))
    cheap = ScriptedLLM(predictor_model(right), ttft=0.02, models=(MODEL,))
    journal = MemoryJournal()
    async with main as main_url, cheap as cheap_url, \
            OpenAIChatClient(MODEL, base_url=main_url) as client, \
            OpenAIChatClient(MODEL, base_url=cheap_url) as small, \
            open_engine(journal, tools=Toolbox({"llm": llm_tool(client)}), concurrency=4) as engine:
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
