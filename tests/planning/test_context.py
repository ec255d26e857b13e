"""The bounded planner context: re-plan prompts stay flat as a run grows, the report carries over, context.read."""

from __future__ import annotations

import json
from typing import Any

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.timing import on_virtual_clock

BATCH = 5


def _batch(n: int) -> list[dict[str, Any]]:
    ids = [f"s{n}_{i}" for i in range(BATCH)]
    steps: list[dict[str, Any]] = [{"id": s, "tool": "noop", "args": {"blob": "x" * 400, "n": s}} for s in ids[:-1]]
    steps.append({"id": ids[-1], "tool": "noop", "args": {"n": ids[-1]}, "after": ids[:-1], "observe": True})
    return steps


async def _run(batches: int, context: str) -> tuple[list[int], list[str], Any]:
    sizes: list[int] = []
    texts: list[str] = []
    state = {"n": 0}

    def script(req: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in req.messages)
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "done"}))
        if "REMAINING plan" in text:
            sizes.append(len(text))
            texts.append(str(req.messages[-1].get("content", "")))
        state["n"] += 1
        if state["n"] > batches:
            return Text("[]\n")
        report = {"report": f"batch {state['n']} written"}
        return Text(plan_lines([report, *_batch(state["n"])]))

    tools = builtin_tools()
    options = PlanningOptions(context=context, max_replans=batches + 2)  # type: ignore[arg-type]
    async with ScriptedLLM(script) as url, OpenAIChatClient("scripted", base_url=url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, options=options)
        result = await loop.run("count to many")
    return sizes, texts, result


@on_virtual_clock
async def test_replan_prompts_stay_bounded_as_the_run_grows() -> None:
    sizes, texts, result = await _run(24, "references")
    assert result.ok, result.error
    assert len(sizes) >= 20
    # After the listed references fill up (30 refs = 6 batches), the prompt no longer grows with finished steps.
    assert max(sizes[8:]) - min(sizes[8:]) < 200, sizes
    assert f"s{len(sizes)}_3" in texts[-1]  # the newest finished step is referenced
    assert "batch" in texts[-1] and "written" in texts[-1]  # the report carried into the next prompt
    calls = [c for c in result.state.model_calls if "report" in c]
    assert calls and calls[-1]["report"].startswith("batch")  # journaled with its model call


@on_virtual_clock
async def test_the_summary_baseline_loses_the_newest_steps_to_its_cut() -> None:
    sizes, texts, result = await _run(24, "summary")
    assert result.ok, result.error
    assert f"s{len(sizes)}_3" not in texts[-1]


@on_virtual_clock
async def test_context_read_fetches_detail_into_the_next_prompt() -> None:
    replans: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        text = str(req.messages[-1].get("content", ""))
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "done"}))
        if "REMAINING plan" in text:
            replans.append(text)
            return Text("[]\n")
        return Text(plan_lines([
            {"id": "big", "tool": "noop", "args": {"items": [{"title": "t" * 300}, {"title": "needle-42"}]}},
            {"id": "look", "tool": "context.read", "args": {"step": "big", "path": "items[1]", "max_chars": 100},
             "after": ["big"], "observe": True},
        ]))

    tools = builtin_tools()
    async with ScriptedLLM(script) as url, OpenAIChatClient("scripted", base_url=url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions(context="references", max_replans=3))
        result = await loop.run("find the needle")
    assert result.outputs["look"]["text"] == '{"title":"needle-42"}'
    assert "needle-42" in replans[0] and "Detail you read" in replans[0]
