"""`llm` steps of a run by reference: large referenced outputs shown as references, their detail read on request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.llm import llm_tool
from tests.timing import on_virtual_clock

BLOB = "t" * 600
PLAN = [
    {"id": "big", "tool": "noop", "args": {"items": [{"title": BLOB}, {"title": "needle-42"}]}},
    {"id": "small", "tool": "noop", "args": {"v": 7}},
    {"id": "ask", "tool": "llm", "args": {"prompt": "Find the needle in ${big} (small: ${small.v})"}},
]


async def _run(context: str) -> tuple[list[str], Any]:
    llm_prompts: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        text = str(req.messages[-1].get("content", ""))
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "done"}))
        if text.startswith("Find the needle"):
            llm_prompts.append(text)
            if "Detail of big" not in text and "[ref big" in text:
                return Text(json.dumps({"context.read": {"step": "big", "path": "items[1]", "max_chars": 100}}))
            return Text("found " + ("needle-42" if "needle-42" in text else "nothing"))
        return Text(plan_lines(PLAN))

    async with ScriptedLLM(script) as url, OpenAIChatClient("scripted", base_url=url, api_key="k") as client, \
            open_engine("memory://", clock=VirtualClock()) as engine:
        tools = builtin_tools().merged({"llm": llm_tool(client)})
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions(
            context=context, max_replans=1))  # type: ignore[arg-type]
        result = await loop.run("find the needle")
    return llm_prompts, result


@on_virtual_clock
async def test_an_llm_step_sees_a_large_output_by_reference_and_reads_its_detail() -> None:
    prompts, result = await _run("references")
    assert result.ok, result.error
    first = prompts[0]
    assert BLOB not in first and "[ref big (noop, " in first  # by reference: id, tool, size, summary
    assert "(small: 7)" in first  # a small value inline, as the engine renders it
    assert len(prompts) == 2 and "needle-42" in prompts[1]  # the detail read, added to the prompt
    out = result.outputs["ask"]
    assert out["text"] == "found needle-42"
    assert out["references"] == ["big"]
    assert out["reads"] == [{"step": "big", "path": "items[1]", "chars": len('{"title":"needle-42"}')}]
    assert out["tokens"]["total"] > 0


@pytest.mark.parametrize("context", ["summary"])
@on_virtual_clock
async def test_with_the_summary_context_an_llm_step_gets_the_whole_output(context: str) -> None:
    prompts, result = await _run(context)
    assert result.ok, result.error
    assert len(prompts) == 1 and BLOB in prompts[0]
    assert "references" not in result.outputs["ask"]
