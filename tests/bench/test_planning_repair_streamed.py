"""A step the planner streams in while a failed step's repair is in flight stays when the repair restates what it
waits on (the cause of issue 27's planning regression: 51.8 s -> 72.4 s concurrent, goal 2 of `bench planning`
3 -> 8 model calls).

Since 6995a80 a local repair drops the failed region as it is when the proposal lands, so a dependent that the
initial planner wrote after the repair prompt went out was dropped though the repair restated its dependency under
the same id; the planner's later lines naming it were then rejected, each rejection a round trip with the model, and
the restated lines ran work again. On the virtual clock: "``a`` fails while the planner still writes" and "``c``
arrives after the repair prompt, before the repair lands" are orders of virtual time, the same on every run.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_loop import purpose
from tests.timing import on_virtual_clock


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _step_id(step: Any) -> str:
    return str(step["id"] if isinstance(step, dict) else step.id)


@on_virtual_clock
async def test_a_dependent_streamed_during_a_repair_that_restates_its_dependency_is_kept() -> None:
    port = closed_port()
    plan: list[dict[str, Any]] = [
        {"id": "a", "tool": "http.get", "args": {"url": f"http://127.0.0.1:{port}/x"}, "retries": 0},
        {"id": "b", "tool": "sleep", "args": {"seconds": 3}},
        {"id": "c", "tool": "noop", "args": {"a": "${a}"}},  # after the repair prompt, before the repair lands
        {"id": "d", "tool": "noop", "args": {"c": "${c}", "b": "${b}"}},  # after the repair landed
    ]
    arrivals: dict[str, float] = {}

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(plan), tokens_per_second=20)
        if p == "repair":  # the failed step restated under its own id
            return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"fixed": True}}]), ttft=2.0)
        return Text(json.dumps({"answer": "done"}))

    tools = builtin_tools()
    server = ScriptedLLM(script)
    async with server as url, OpenAIChatClient("scripted", base_url=url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions())
        run = await loop.start("fix it")
        run.subscribe(lambda e: arrivals.update({_step_id(s): e.at for s in e.data.get("steps", ())})
                      if e.kind == "steps_added" and e.data.get("trigger") == "initial" else None)
        result = await run.wait()

    state = result.state
    repair = next(v for v in state.versions if v["trigger"] == "local_repair")
    asked = next(e for e in state.escalations if e["rung"] == "local_repair")
    # The order the test is about: c arrived after the repair was asked for a region without it, before it landed.
    assert asked["region"] == ["a"], asked
    assert asked["at"] < arrivals["c"] < repair["spliced_at"], (arrivals, asked, repair)
    assert result.ok, (result.error, state.escalations)
    assert [purpose(r) for r in server.chat_requests] == ["plan", "repair", "join"]  # no rejected-line round trip
    assert [e["rung"] for e in state.escalations] == ["local_repair"]
    assert repair["dropped"] == []  # c waits on 'a', which the repair restated: c is kept
    assert result.outputs["c"] == {"a": {"fixed": True}}
    assert state.records["c"].attempts == 1 and state.records["d"].status == "succeeded"
