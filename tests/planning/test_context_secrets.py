"""A context that cuts outputs short does not cut a secret in two: outputs are redacted before they are cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.safety import SecretRedactor
from tests.timing import on_virtual_clock

SECRET = "sk-live-context-0123456789abcdef"


@pytest.mark.parametrize(("context", "lead"), [("summary", 40), ("references", 130)])
@on_virtual_clock
async def test_a_secret_straddling_an_output_cut_never_reaches_the_model(context: str, lead: int) -> None:
    # 61 steps: the state summary cuts each output to max(80, 4000 // 61) - 15 = 65 characters, a reference's
    # summary to 157; after ``lead`` characters, the secret starts before the cut and ends after it.
    shown = "y" * lead
    steps: list[dict[str, Any]] = [{"id": f"s{i}", "tool": "noop", "args": {"i": i}} for i in range(59)]
    # The token finishes last (after the others): among the references listed, the most recent ones.
    steps.append({"id": "tok", "tool": "noop", "args": {"note": shown + SECRET + "z" * 200},
                  "after": [s["id"] for s in steps]})
    steps.append({"id": "look", "tool": "noop", "args": {}, "after": ["tok"], "observe": True})
    bodies: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        text = str(req.messages[-1].get("content", ""))
        bodies.append(json.dumps(req.body))
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "done"}))
        if "REMAINING plan" in text:
            return Text("[]\n")
        return Text(plan_lines(steps))

    tools = builtin_tools()
    redactor = SecretRedactor({"OPENAI_API_KEY": SECRET})
    async with ScriptedLLM(script) as url, OpenAIChatClient("scripted", base_url=url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock(), redact=redactor) as engine:
        loop = PlanningLoop(engine, client, tools,
                            options=PlanningOptions(context=context, max_replans=2))  # type: ignore[arg-type]
        result = await loop.run("hold a token")
    assert result.ok, result.error
    replans = [b for b in bodies if "REMAINING plan" in b]
    assert replans and shown in replans[0]  # the output is shown, cut
    assert not [b for b in replans if SECRET[:8] in b]
