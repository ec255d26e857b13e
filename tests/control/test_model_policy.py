"""The model policy over a real OpenAI-compatible endpoint (the scripted server), on the real clock: each chunk is
one completion, its actions run at the ticks they were for."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from planweave.control import ChunkRequest, ControlError, ControlLoop
from planweave.control.model_policy import ModelPolicy
from planweave.core.clock import RealClock
from planweave.models.openai import OpenAIChatClient
from planweave.testing import RecordedRequest, ScriptedLLM, Text


class Line:
    def __init__(self) -> None:
        self.position = 0
        self.actions: list[Any] = []

    def observe(self) -> dict[str, int]:
        return {"position": self.position}

    def act(self, action: Any, dt: float) -> None:
        self.actions.append(action)
        self.position += 1


def reply(request: RecordedRequest) -> Text:
    """Answer with actions named after the tick they are for (read from the prompt)."""
    prompt = request.body["messages"][-1]["content"]
    start = int(prompt.split("the first for tick ")[1].rstrip("."))
    return Text(json.dumps({"actions": [start + i for i in range(6)]}))


async def test_chunks_come_from_the_model_and_run_at_their_ticks() -> None:
    server = ScriptedLLM(reply, ttft=0.05)
    env = Line()
    async with server as base_url, OpenAIChatClient("gpt-4o-mini", base_url=base_url, api_key="k") as client:
        policy = ModelPolicy(client, action_schema={"type": "integer"}, task="Move along the line.")
        loop = ControlLoop(env=env, policy=policy, rate_hz=50, horizon=6, execute=3, safe_action=-1,
                           clock=RealClock())
        report = await loop.run(until=lambda obs: obs["position"] >= 30)
    assert report.spliced >= 3 and policy.calls == report.requested
    ran = [(r.tick, r.action) for r in report.trace if r.chunk is not None]  # by the loop's tick: a busy machine
    assert [r.action for r in report.trace] == env.actions  # may miss ticks on the real clock
    assert ran and all(a == tick for tick, a in ran)
    first = server.requests[-1].body["messages"][-1]["content"]
    assert "Move along the line." in first and '"position":' in first


async def test_a_reply_without_actions_is_named() -> None:
    server = ScriptedLLM([Text(json.dumps({"actions": []}))])
    async with server as base_url, OpenAIChatClient("gpt-4o-mini", base_url=base_url, api_key="k") as client:
        policy = ModelPolicy(client, action_schema={"type": "integer"})
        request = ChunkRequest(4, {"position": 0}, 0, 0, 0.0, 6, 0.02)
        with pytest.raises(ControlError, match="chunk 4"):
            await asyncio.wait_for(policy(request), 10)
