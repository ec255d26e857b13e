"""Local repair of a failed region: replacements that keep, rename or merge the region's step ids (issue 8, #12).

On the virtual clock: "``a`` fails while the planner still writes" and "``c`` arrives before the repair lands" are
orders of virtual time, the same on every run.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.engine.runtime import RunResult
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_loop import purpose
from tests.timing import on_virtual_clock

ANSWER = Text(json.dumps({"answer": "done"}))


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def initial_plan(port: int) -> list[dict[str, Any]]:
    return [
        {"id": "a", "tool": "http.get", "args": {"url": f"http://127.0.0.1:{port}/x"}, "retries": 0},
        {"id": "b", "tool": "sleep", "args": {"seconds": 0.3}},
        {"id": "c", "tool": "noop", "args": {"a": "${a}", "b": "${b}"}},
    ]


def replacement(port: int) -> dict[str, Any]:
    return {"tool": "noop", "args": {"fixed": True, "port": port}}


def repairs(port: int) -> dict[str, list[dict[str, Any]]]:
    fix = replacement(port)
    return {
        "kept": [{"id": "a2", **fix}, {"id": "c", "tool": "noop", "args": {"a": "${a2}", "b": "${b}"}}],
        "renamed": [{"id": "a2", **fix}, {"id": "c2", "tool": "noop", "args": {"a": "${a2}", "b": "${b}"}}],
        "merged": [{"id": "ac", "tool": "noop", "args": {"fixed": True, "b": "${b}"}}],
        "same_ids": [{"id": "a", **fix}, {"id": "c", "tool": "noop", "args": {"a": "${a}", "b": "${b}"}}],
        # restates 'b' (outside the region, running or finished) as it was: adopted or kept, not run again
        "restates_b": [{"id": "b", "tool": "sleep", "args": {"seconds": 0.3}}, {"id": "a2", **fix},
                       {"id": "c2", "tool": "noop", "args": {"a": "${a2}", "b": "${b}"}}],
    }


async def run_goal(script: Callable[[RecordedRequest], Reply], *, tps: float | None = None,
                   ) -> tuple[RunResult, ScriptedLLM]:
    server = ScriptedLLM(script, tokens_per_second=tps)
    tools = builtin_tools()
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        return await PlanningLoop(engine, client, tools, options=PlanningOptions()).run("fix it"), server


@pytest.mark.parametrize("tps", [None, 100.0], ids=["written", "streaming"])
@pytest.mark.parametrize("shape", ["kept", "renamed", "merged", "same_ids", "restates_b"])
@on_virtual_clock
async def test_a_repair_may_keep_rename_or_merge_the_region_steps(shape: str, tps: float | None) -> None:
    """``written``: the whole plan is in when ``a`` fails. ``streaming``: ``a`` fails while the planner still writes,
    ``c`` arrives after the repair prompt was sent and before the repair lands (so the region grew meanwhile)."""
    port = closed_port()
    fix = repairs(port)[shape]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(initial_plan(port)))
        if p == "repair":
            return Text(plan_lines(fix), ttft=0.6 if tps else None)
        return ANSWER

    result, server = await run_goal(script, tps=tps)
    assert result.ok, (result.error, result.state.escalations)
    assert [purpose(r) for r in server.chat_requests] == ["plan", "repair", "join"]
    assert [e["rung"] for e in result.state.escalations] == ["local_repair"]
    assert result.summary["answer"] == "done"
    b_attempts = [r for r in result.state.retired if r[1].id == "b"]
    assert result.state.records["b"].status == "succeeded" and not b_attempts  # b ran once, never replaced
    last = fix[-1]["id"]
    assert result.state.records[last].status == "succeeded"
    region_left = {"a", "c"} - {s["id"] for s in fix}
    for sid in region_left:  # the region's steps the repair did not restate are gone from the plan
        assert sid not in result.state.plan.steps
    repair = next(v for v in result.state.versions if v["trigger"] == "local_repair")
    assert set(repair["dropped"]) == region_left - {"a"}  # the skipped region steps, journaled as dropped
    assert "b" in repair["kept"] + repair["adopted"]


@on_virtual_clock
async def test_a_failed_run_reports_the_joiners_text_as_partial_not_as_the_answer() -> None:
    port = closed_port()
    stale = [{"id": "again", "tool": "noop", "args": {"x": "${a}"}}]  # refers to the failed step: always refused

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(initial_plan(port)))
        if p in ("repair", "replan"):
            return Text(plan_lines(stale))
        return Text(json.dumps({"answer": "b slept, a is unreachable"}))

    result, server = await run_goal(script)
    assert result.status == "failed"
    assert [purpose(r) for r in server.chat_requests][-1] == "join"  # the joiner was asked and answered
    assert result.summary["answer"] is None
    assert result.summary["partial_answer"] == "b slept, a is unreachable"
    assert result.state.answer == "b slept, a is unreachable"  # the journaled text is kept as it was


@on_virtual_clock
async def test_a_line_streamed_after_a_repair_replaced_its_dependency_is_fed_back_once() -> None:
    """The repair of 'a' lands before the planner has written 'c' (which refers to 'a'): the repair could not know
    'c', so the planner is told once which step it refers to is gone, and its corrected line runs."""
    port = closed_port()
    fix = replacement(port)

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text(plan_lines(initial_plan(port)), tokens_per_second=40)  # 'c' arrives after about 1.2 s
        if p == "repair":
            return Text(plan_lines([{"id": "a2", **fix}]))
        if p == "fix":
            return Text(plan_lines([{"id": "c", "tool": "noop", "args": {"a": "${a2}", "b": "${b}"}}]))
        return ANSWER

    result, server = await run_goal(script)
    assert result.ok, (result.error, result.state.escalations)
    assert [purpose(r) for r in server.chat_requests] == ["plan", "repair", "fix", "join"]
    fix_prompt = next(r for r in server.chat_requests if purpose(r) == "fix").messages[-1]["content"]
    assert "refers to unknown step 'a' (did you mean 'a2'?)" in fix_prompt
    assert result.outputs["c"] == {"a": {"fixed": True, "port": port}, "b": {"slept": 0.3}}
