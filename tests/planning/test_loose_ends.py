"""Loose ends of the planning loop: closing an engine under a planner, a model that cannot be reached, a person's
abort, and counting the ladder's rungs (once, and across a resume)."""

from __future__ import annotations

import asyncio

from planweave import Engine, RunError, VirtualClock, open_engine, run_virtual
from planweave.engine.runtime import RunResult
from planweave.journal.memory import MemoryJournal
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import ScriptedLLM
from tests.planning.test_ask_human import GOAL, PLAN, script_for, weather
from tests.planning.test_loop import purpose
from tests.timing import on_virtual_clock, step_is, until


# -- 2. Engine.__aexit__ cancels what Engine.spawn started ---------------------------------------------------------
def test_closing_the_engine_cancels_the_tasks_it_spawned() -> None:
    async def main() -> tuple[bool, bool]:
        forever = asyncio.Event()
        async with asyncio.timeout(5):  # virtual: a hang fails at once instead of after the pytest timeout
            async with Engine(MemoryJournal(), clock=VirtualClock()) as engine:
                task = engine.spawn(forever.wait(), name="waits-forever")
                await asyncio.sleep(0)
        return task.cancelled(), task.done()

    assert run_virtual(main()) == (True, True)


# -- 3. an abort ends the run at once: other branches do not run on -------------------------------------------------
def test_an_abort_stops_a_40_s_branch_at_once_and_the_run_cannot_be_resumed() -> None:
    plan = [*PLAN, {"id": "slow", "tool": "sleep", "args": {"seconds": 40, "result": "late"}}]
    tools = weather([], {"Paris"})
    journal = MemoryJournal()

    async def main() -> tuple[RunResult, str]:
        async with ScriptedLLM(script_for(plan)) as base_url, \
                OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client:
            async with Engine(journal, clock=VirtualClock(), tools=tools) as engine:
                options = PlanningOptions(max_replans=0, ask_human=True)
                run = await PlanningLoop(engine, client, tools, options=options).start(GOAL)
                asks: asyncio.Queue[str] = asyncio.Queue()
                run.subscribe(lambda e: asks.put_nowait(e.step) if e.kind == "input_requested" and e.step else None)
                async with asyncio.timeout(100):  # virtual seconds
                    await run.send(await asks.get(), {"action": "abort"})
                    result = await run.wait()
            async with Engine(journal, tools=tools, clock=VirtualClock()) as engine:
                try:
                    await engine.resume(run.id)
                except RunError as exc:
                    return result, str(exc)
        return result, "resumed"

    result, resumed = run_virtual(main())
    assert result.status == "failed"
    assert result.error is not None and "a person chose to abort" in result.error and "paris" in result.error
    assert result.summary["makespan_s"] < 40  # the sleeping branch did not run on
    assert result.state.records["slow"].status == "cancelled" and "slow" not in result.outputs
    assert [e["rung"] for e in result.state.escalations] == ["human", "fail"]
    assert "nothing to resume" in resumed  # an abort is final


# -- 4. the ladder's rungs are counted once, and across a resume ---------------------------------------------------
@on_virtual_clock
async def test_an_exhausted_ladder_without_ask_human_records_fail_once() -> None:
    server = ScriptedLLM(script_for(PLAN))
    tools = weather([], {"Paris"})
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        result = await asyncio.wait_for(
            PlanningLoop(engine, client, tools, options=PlanningOptions(max_replans=1)).run(GOAL), 10)
    assert result.status == "failed"
    assert [e["rung"] for e in result.state.escalations] == ["local_repair", "global_replan", "fail"]


@on_virtual_clock
async def test_a_resumed_goal_run_counts_the_replans_it_journaled() -> None:
    plan = [{"id": "paris", "tool": "fetch", "args": {"city": "Paris"}},
            {"id": "wait", "tool": "human.input", "args": {"prompt": "go on?"}}]
    journal, tools = MemoryJournal(), weather([], {"Paris"})
    options = PlanningOptions(max_replans=1)
    server = ScriptedLLM(script_for(plan))
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client:
        async with Engine(journal, tools=tools, clock=VirtualClock()) as engine:
            run = await PlanningLoop(engine, client, tools, options=options).start(GOAL)
            gave_up = asyncio.Event()
            run.subscribe(lambda e: gave_up.set() if e.data.get("rung") == "fail" else None)
            await asyncio.wait_for(gave_up.wait(), 10)  # one local repair spent the only re-plan; 'wait' waits
        before = len(server.chat_requests)
        async with Engine(journal, tools=tools, clock=VirtualClock()) as engine:
            resumed = await PlanningLoop(engine, client, tools, options=options).resume(run.id)
            await until(resumed, step_is("wait", "waiting_input"), "step 'wait' waiting for input")
            await resumed.send("wait", "yes")
            result = await asyncio.wait_for(resumed.wait(), 10)
    assert [purpose(r) for r in server.chat_requests[before:]] == []  # no second repair after the resume
    assert result.status == "failed"
    assert [e["rung"] for e in result.state.escalations] == ["local_repair", "global_replan", "fail"]

