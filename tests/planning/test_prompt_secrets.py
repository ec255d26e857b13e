"""What the planner is sent about a run hides the secrets the live run holds (outputs, plan steps, errors)."""

from __future__ import annotations

import json
from typing import Any

from planweave import builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.safety import SecretRedactor
from tests.planning.test_loop import purpose
from tests.planning.test_repair_region import closed_port

SECRET = "sk-live-plan-0123456789"


async def test_a_repair_prompt_does_not_show_the_model_a_secret_and_a_restated_step_keeps_it() -> None:
    port = closed_port()
    seen: list[Any] = []
    tools = builtin_tools()

    def token() -> str:
        """Reads a credential (as a tool reading the environment would)."""
        return SECRET

    def use(auth: str) -> str:
        """Uses a credential."""
        seen.append(auth)  # recorded, asserted after the run
        return "used"

    tools.add(token, name="token", idempotent=True)
    tools.add(use, name="use")
    first: list[dict[str, Any]] = [{"id": "t", "tool": "token"},
             {"id": "a", "tool": "http.get", "args": {"url": f"http://127.0.0.1:{port}/x"}, "retries": 0,
              "after": ["t"]},
             {"id": "u", "tool": "use", "args": {"auth": f"Bearer {SECRET}"}, "after": ["a"]}]
    prompts: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        prompts.append(json.dumps(req.body))
        if p == "plan":
            return Text(plan_lines(first))
        if p == "repair":
            # The model restates 'u' as it was shown (its secret as ***), replacing the failed 'a'; it also tries
            # to move the secret: 'v' and 'w' (another tool) copy u's arguments and get them as written.
            shown = {"tool": "use", "args": {"auth": "Bearer ***"}, "after": ["a2"]}
            return Text(plan_lines([{"id": "a2", "tool": "noop", "args": {}}, {"id": "u", **shown},
                                    {"id": "v", **shown}, {"id": "w", **shown, "tool": "noop"}]))
        return Text(json.dumps({"answer": "done"}))

    async with ScriptedLLM(script) as base_url, \
            OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, redact=SecretRedactor({"OPENAI_API_KEY": SECRET})) as engine:
        result = await PlanningLoop(engine, client, tools, options=PlanningOptions()).run("use the token")
    assert result.ok, (result.error, result.state.escalations)
    assert len(prompts) >= 2
    assert not [p for p in prompts if SECRET in p]
    assert sorted(seen) == ["Bearer ***", f"Bearer {SECRET}"]
    assert result.outputs["w"] == {"auth": "Bearer ***"}
