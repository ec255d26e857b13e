"""People in a goal run: the planner's approval and human.input steps, and the ladder's last rung that asks a person.

Real parts: the scripted OpenAI-compatible server on 127.0.0.1, the engine with a memory journal, and a "person" that
answers through :meth:`Run.approve` / :meth:`Run.send` when the run asks (observed through its events).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from planweave import Engine, InputRejected, RunError, Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.core.events import Event
from planweave.engine.runtime import Run, RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.planning.test_loop import ANSWER, purpose
from tests.timing import on_virtual_clock

GOAL = "compare the weather in Paris and Rome"
PLAN = [
    {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
    {"id": "rome", "tool": "fetch", "args": {"city": "Rome"}},
    {"id": "pick", "tool": "noop", "args": {"p": "${paris.temp}", "r": "${rome.temp}"}},
]
Person = Callable[[Run, "asyncio.Queue[str]", list[Any]], Awaitable[None]]


def weather(calls: list[str], down: set[str]) -> Toolbox:
    """Built-ins plus ``fetch``, which fails for the cities in ``down`` (the test changes it to mend a city)."""
    box = builtin_tools()

    async def fetch(city: str) -> dict[str, Any]:
        """Fetch the weather of a city."""
        calls.append(city)
        await asyncio.sleep(0.01)
        if city in down:
            raise ConnectionError(f"{city} is down")
        return {"city": city, "temp": len(city) * 3}

    box.add(fetch, idempotent=True)
    return box


def script_for(plan: list[dict[str, Any]]) -> Callable[[RecordedRequest], Reply]:
    """The planner writes ``plan``; a repair or re-plan restates it unchanged (so a broken step stays broken)."""

    def script(req: RecordedRequest) -> Reply:
        return ANSWER if purpose(req) == "join" else Text(plan_lines(plan))

    return script


async def with_person(
    script: Callable[[RecordedRequest], Reply], tools: Toolbox, options: PlanningOptions, person: Person,
) -> tuple[RunResult, ScriptedLLM, list[Any]]:
    """Run the goal; ``person`` gets the run, a queue of the steps that ask someone, and a list to record into."""
    server = ScriptedLLM(script)
    seen: list[Any] = []
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        run = await PlanningLoop(engine, client, tools, options=options).start(GOAL)
        asks: asyncio.Queue[str] = asyncio.Queue()

        def listen(event: Event) -> None:
            if event.kind in ("approval_requested", "input_requested") and event.step is not None:
                asks.put_nowait(event.step)

        run.subscribe(listen)
        await asyncio.wait_for(person(run, asks, seen), 10)
        return await asyncio.wait_for(run.wait(), 10), server, seen


def answer_with(*values: Any) -> Person:
    """A person who answers the first question with each of ``values`` in turn, recording refusals."""

    async def person(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        if not values:
            return
        step = await asks.get()
        seen.append((step, run.state.records[step].status, run.state.records[step].input_schema))
        for value in values:
            try:
                await run.send(step, value)
            except InputRejected as exc:
                seen.append(str(exc))

    return person


# -- 1. the planner may write approval and human.input steps ------------------------------------------------------
@on_virtual_clock
async def test_the_prompt_documents_approvals_and_human_input() -> None:
    async def nobody(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        return None

    _, server, _ = await with_person(script_for(PLAN[1:2]), weather([], set()), PlanningOptions(), nobody)
    system = str(server.chat_requests[0].messages[0]["content"])
    assert '"approval"' in system and "irreversible" in system and "deploy" in system
    assert "human.input" in system and "can only come from a person" in system


@on_virtual_clock
async def test_a_planned_approval_step_waits_until_approved_then_the_run_finishes() -> None:
    calls: list[str] = []
    plan = [PLAN[1], {"id": "book", "tool": "fetch", "args": {"city": "Rome-hotel"}, "after": ["rome"],
                      "approval": "Book the hotel (pays)?"}]

    async def approver(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        step = await asks.get()
        seen.append((step, run.state.records[step].status, list(calls)))
        await run.approve(step, reason="fine")

    result, _, seen = await with_person(script_for(plan), weather(calls, set()), PlanningOptions(), approver)
    assert result.ok, result.error
    assert seen == [("book", "waiting_approval", ["Rome"])]  # nothing booked before the approval
    assert calls == ["Rome", "Rome-hotel"] and result.summary["answer"] == "Rome is warmer"


@on_virtual_clock
async def test_a_planned_human_input_step_takes_the_value_a_person_sends() -> None:
    plan = [{"id": "city", "tool": "human.input", "args": {"prompt": "Which city?", "schema": {"type": "string"}}},
            {"id": "w", "tool": "fetch", "args": {"city": "${city}"}}]
    calls: list[str] = []
    result, _, seen = await with_person(script_for(plan), weather(calls, set()), PlanningOptions(),
                                        answer_with(7, "Oslo"))
    assert result.ok, result.error
    assert seen[0][:2] == ("city", "waiting_input")
    assert seen[1].endswith("the value is refused: 7 is not of type 'string'")
    assert calls == ["Oslo"] and result.outputs["w"] == {"city": "Oslo", "temp": 12}


# -- 2. --ask-human: the last rung of the ladder asks a person -----------------------------------------------------
def rungs(result: RunResult) -> list[str]:
    return [e["rung"] for e in result.state.escalations]


@on_virtual_clock
async def test_without_ask_human_the_exhausted_ladder_fails_as_before() -> None:
    result, server, _ = await with_person(script_for(PLAN), weather([], {"Paris"}), PlanningOptions(max_replans=0),
                                          answer_with())
    assert result.status == "failed" and rungs(result) == ["fail"]  # once: the plan running out adds none
    assert [purpose(r) for r in server.chat_requests] == ["plan"]


@on_virtual_clock
async def test_ask_human_costs_nothing_when_nothing_fails() -> None:
    result, server, _ = await with_person(script_for(PLAN), weather([], set()), PlanningOptions(ask_human=True),
                                          answer_with())
    assert result.ok and rungs(result) == []
    assert [purpose(r) for r in server.chat_requests] == ["plan", "join"]
    assert {s.tool for s in result.state.plan.steps.values()} == {"fetch", "noop"}


@on_virtual_clock
async def test_retry_runs_the_failed_step_again_after_the_ladder_is_exhausted() -> None:
    calls: list[str] = []
    down = {"Paris"}

    async def mend_then_retry(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        step = await asks.get()
        seen.append((step, list(calls)))
        down.clear()
        await run.send(step, {"action": "retry"})

    result, server, seen = await with_person(script_for(PLAN), weather(calls, down),
                                             PlanningOptions(max_replans=1, ask_human=True), mend_then_retry)
    assert result.ok, result.error
    assert rungs(result) == ["local_repair", "global_replan", "human"]
    human = result.state.escalations[-1]
    assert human["step"] == "paris" and human["question"] == seen[0][0] == "paris_ask"
    assert "re-plan limit (1) reached" in human["reason"]
    assert seen[0][1].count("Paris") == 2  # asked only once the planner's repair had failed too
    assert calls.count("Paris") == 3 and calls.count("Rome") == 1  # the finished branch was not re-run
    last = result.state.versions[-1]
    assert last["trigger"] == "human_retry" and "paris" in last["added"] and "rome" in last["kept"]
    assert result.outputs["pick"] == {"p": 15, "r": 12}
    assert [purpose(r) for r in server.chat_requests] == ["plan", "repair", "join"]


@on_virtual_clock
async def test_skip_gives_the_dependents_the_persons_value_and_refuses_malformed_answers() -> None:
    person = answer_with({"action": "later"}, {"action": "skip"}, {"action": "skip", "value": {"temp": 99}})
    result, _, seen = await with_person(script_for(PLAN), weather([], {"Paris"}),
                                        PlanningOptions(max_replans=0, ask_human=True), person)
    assert result.ok, result.error
    assert seen[0][:2] == ("paris_ask", "waiting_input")
    assert seen[0][2]["properties"]["action"]["enum"] == ["retry", "skip", "abort"]
    assert "'later' is not one of ['retry', 'skip', 'abort']" in seen[1]
    assert "'value' is a required property" in seen[2] and len(seen) == 3
    assert rungs(result) == ["human"]
    assert result.outputs["pick"] == {"p": 99, "r": 12}
    assert "paris" not in result.state.records  # replaced by the person's value: the run did not fail
    assert result.state.plan.steps["pick"].args == {"p": "${paris_ask.value.temp}", "r": "${rome.temp}"}
    assert result.state.versions[-1]["trigger"] == "human_skip"


@on_virtual_clock
async def test_abort_ends_the_run_failed_without_another_model_call() -> None:
    result, server, _ = await with_person(script_for(PLAN), weather([], {"Paris"}),
                                          PlanningOptions(max_replans=0, ask_human=True),
                                          answer_with({"action": "abort"}))
    assert result.status == "failed"
    assert result.error is not None and "step 'paris' failed" in result.error
    assert rungs(result) == ["human", "fail"]
    assert "a person chose to abort" in result.state.escalations[-1]["reason"]
    assert [purpose(r) for r in server.chat_requests] == ["plan"]  # no joiner, no re-plan


@on_virtual_clock
async def test_a_retry_that_fails_again_asks_again() -> None:
    async def retry_twice_then_abort(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        for action in ("retry", "abort"):
            step = await asks.get()
            seen.append(step)
            await run.send(step, {"action": action})

    result, _, seen = await with_person(script_for(PLAN), weather([], {"Paris"}),
                                        PlanningOptions(max_replans=0, ask_human=True), retry_twice_then_abort)
    assert seen == ["paris_ask", "paris_ask2"]
    assert result.status == "failed" and rungs(result) == ["human", "human", "fail"]


def test_ask_human_needs_the_human_input_tool() -> None:
    async def go() -> None:
        async with OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1", api_key="k") as client, \
                open_engine("memory://") as engine:
            PlanningLoop(engine, client, Toolbox({}), options=PlanningOptions(ask_human=True))

    with pytest.raises(ValueError, match=r"ask_human needs the 'human\.input' tool"):
        asyncio.run(go())



@on_virtual_clock
async def test_a_repair_elsewhere_keeps_a_step_that_waits_for_a_person() -> None:
    calls: list[str] = []
    plan = [{"id": "gate", "tool": "fetch", "args": {"city": "Bern"}, "approval": "Pay?"},
            {"id": "paris", "tool": "fetch", "args": {"city": "Paris"}}]

    def script(req: RecordedRequest) -> Reply:
        p = purpose(req)
        if p == "repair":
            return Text(plan_lines([{"id": "paris", "tool": "fetch", "args": {"city": "Paris-Orly"}}]))
        return ANSWER if p == "join" else Text(plan_lines(plan))

    async def approve_after_the_repair(run: Run, asks: asyncio.Queue[str], seen: list[Any]) -> None:
        repaired = asyncio.Event()
        run.subscribe(lambda e: repaired.set() if e.kind == "plan_version" else None)
        step = await asks.get()
        await repaired.wait()
        seen.append(run.state.records[step].status)
        try:
            await run.approve(step)
        except RunError as exc:
            seen.append(str(exc))

    result, _, seen = await with_person(script, weather(calls, {"Paris"}), PlanningOptions(),
                                        approve_after_the_repair)
    assert seen == ["waiting_approval"]  # the repair's plan version kept it (it was cancelled as "left out")
    assert result.ok, result.error
    assert calls.count("Bern") == 1 and "Paris-Orly" in calls


@on_virtual_clock
async def test_a_question_pending_at_an_interruption_is_asked_again_and_its_answer_applies_after_resume() -> None:
    journal = MemoryJournal()
    tools = weather([], {"Paris"})
    options = PlanningOptions(max_replans=0, ask_human=True)
    server = ScriptedLLM(script_for(PLAN))
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client:
        async with Engine(journal, tools=tools, clock=VirtualClock()) as engine:
            run = await PlanningLoop(engine, client, tools, options=options).start(GOAL)
            asked = asyncio.Event()
            run.subscribe(lambda e: asked.set() if e.kind == "input_requested" else None)
            await asyncio.wait_for(asked.wait(), 10)
        async with Engine(journal, tools=tools, clock=VirtualClock()) as engine:
            resumed = await PlanningLoop(engine, client, tools, options=options).resume(run.id)
            step = next(iter(resumed.state.waiting_steps()))  # asked again as the run resumed
            await resumed.send(step, {"action": "skip", "value": {"temp": 1}})
            result = await asyncio.wait_for(resumed.wait(), 10)
    assert step == "paris_ask"
    assert result.ok, result.error
    assert result.outputs["pick"] == {"p": 1, "r": 12}
    assert rungs(result) == ["human"]  # not asked twice, not re-planned after the resume
