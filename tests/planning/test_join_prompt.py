"""The joiner is shown the run's report without the planner's instruction to rewrite it (it writes no plan lines)."""

from __future__ import annotations

import json

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.limits import RunLimits
from planweave.models.openai import OpenAIChatClient
from planweave.planning import build_planning_loop
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.timing import on_virtual_clock

JOIN = "If the results answer the goal"


def script(req: RecordedRequest) -> Reply:
    if JOIN in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "done"}))
    return Text(plan_lines([{"report": "n1 is the count to keep"}, {"id": "n1", "tool": "noop", "args": {}}]))


@on_virtual_clock
async def test_the_joiner_gets_the_report_without_the_instruction_to_rewrite_it() -> None:
    llm = ScriptedLLM(script)
    async with llm as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", clock=VirtualClock()) as engine:
        loop = build_planning_loop(engine, client, builtin_tools(), RunLimits())
        result = await loop.run("count", run_id="r")
    assert result.ok and result.state.answer == "done", result.error
    (join,) = [str(r.messages[-1]["content"]) for r in llm.chat_requests if JOIN in str(r.messages[-1]["content"])]
    assert "Report (the planner's notes on the run):\nn1 is the count to keep" in join, join
    assert "rewrite it" not in join and '{"report"' not in join
