"""Reading planner replies: prose, fences and bullets around a plan are skipped; broken step lines are reported."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from planweave import RunResult, VirtualClock, builtin_tools, open_engine
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop
from planweave.planning.lines import LineParser
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_loop import purpose
from tests.timing import on_virtual_clock

STEPS = [{"id": "one", "tool": "noop", "args": {"n": 1}}, {"id": "two", "tool": "noop", "args": {"n": "${one.n}"}}]


def parse(text: str) -> tuple[list[dict[str, object]], list[str]]:
    parser = LineParser()
    lines = [*parser.feed(text), *parser.close()]
    return [s for line in lines for s in line.steps], [line.error for line in lines if line.error]


@pytest.mark.parametrize("text", [
    "Here is the plan:\n```json\n{lines}```\n",
    "Sure! The plan has two steps.\n\n{lines}\nLet me know if you need anything else.",
    "- {first}\n- {second}\n",  # markdown bullets around JSON objects
    "1. `{first}`\n2. `{second}`\n",
    "[\n{first},\n{second}\n]\n",  # a JSON array written one step per line
    "## Plan\n* fetch the number\n* copy it\n\n{lines}",
])
def test_lines_that_are_plainly_not_steps_are_skipped(text: str) -> None:
    first, second = (json.dumps(s) for s in STEPS)
    steps, errors = parse(text.format(lines=plan_lines(STEPS), first=first, second=second))
    assert steps == STEPS
    assert errors == []


@pytest.mark.parametrize(("line", "reason"), [
    ('{"id": "one", "tool": "noop", "args": {', "is not valid JSON"),
    ('step one: "id": "one", "tool": "noop"', "is not valid JSON"),
    ("[1, 2]", "is not a step object"),
    ('- {"id": "one" "tool": "noop"}', "is not valid JSON"),
])
def test_a_line_that_looks_like_a_step_and_is_broken_is_reported(line: str, reason: str) -> None:
    steps, errors = parse(f"Here is the plan:\n{line}\n")
    assert steps == []
    assert len(errors) == 1 and errors[0].startswith("line 2 ") and reason in errors[0]


def test_the_parser_counts_step_lines() -> None:
    parser = LineParser()
    parser.feed("Nothing to do.\n")
    parser.close()
    assert parser.step_lines == 0
    parser = LineParser()
    parser.feed("[]\n")
    assert parser.step_lines == 1  # an explicit empty plan is an answer, not prose


async def copy_a_number(script: Callable[[RecordedRequest], Reply]) -> tuple[RunResult, ScriptedLLM]:
    """The goal "copy a number" planned by ``script`` (on the virtual clock); the result and the model server."""
    tools = builtin_tools()
    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        return await PlanningLoop(engine, client, tools).run("copy a number"), server


@on_virtual_clock
async def test_prose_and_fences_around_a_plan_cost_no_extra_model_call() -> None:
    reply = "Here is the plan:\n```json\n" + plan_lines(STEPS) + "```\n"

    def script(req: RecordedRequest) -> Reply:
        return Text(reply) if purpose(req) == "plan" else Text(json.dumps({"answer": "1"}))

    result, server = await copy_a_number(script)
    assert result.ok, result.error
    assert [purpose(r) for r in server.chat_requests] == ["plan", "join"]
    assert result.state.escalations == []
    assert result.outputs["two"] == {"n": 1}


@on_virtual_clock
async def test_a_reply_without_any_step_line_is_fed_back() -> None:
    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "plan":
            return Text("I would first fetch the number, then copy it.")
        if p == "fix":
            return Text(plan_lines(STEPS))
        return Text(json.dumps({"answer": "1"}))

    result, server = await copy_a_number(script)
    assert result.ok, result.error
    assert [purpose(r) for r in server.chat_requests] == ["plan", "fix", "join"]
    fix = next(r for r in server.chat_requests if purpose(r) == "fix")
    assert "no step line" in fix.messages[-1]["content"]
