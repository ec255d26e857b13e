"""Cancellation is prompt and journaled; the fold replays to the live state; resume reuses finished work."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from planweave import Engine, RunError, VirtualClock, builtin_tools, run_virtual
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.state import RunState
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import JournalAt, Recorder

CHAIN = {"steps": [
    {"id": "a", "tool": "work", "args": {"name": "a", "seconds": 1}},
    {"id": "b", "tool": "work", "args": {"name": "b", "seconds": 5}, "after": ["a"]},
    {"id": "c", "tool": "work", "args": {"name": "c", "seconds": 5}, "after": ["a"], "idempotent": False},
    {"id": "d", "tool": "work", "args": {"name": "d", "seconds": 1}, "after": ["b", "c"]},
]}


def test_cancel_stops_in_flight_steps_promptly_and_is_journaled(recorder: Recorder, journal_at: JournalAt) -> None:
    async def go() -> Any:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(),
                                                          tools=recorder.toolbox()) as engine:
            run = await engine.start(CHAIN)
            await asyncio.sleep(2)  # a done, b and c running
            run.cancel("enough")
            result = await run.wait()
            return result, asyncio.get_running_loop().time()

    result, t = run_virtual(go())
    assert t == 2.0  # nothing waited for the 5 s steps
    assert result.status == "cancelled"
    steps = result.summary["steps"]
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == steps["c"]["status"] == steps["d"]["status"] == "cancelled"
    assert "b" not in recorder.ends and "d" not in recorder.starts
    kinds = [e.kind for e in journal_at.events()]
    assert kinds[-2:] == ["run_cancelled", "run_finished"]


def test_fold_of_the_journal_equals_the_live_state(recorder: Recorder, journal_at: JournalAt) -> None:
    doc = {"steps": [*CHAIN["steps"], {"id": "f", "tool": "work", "args": {"name": "f", "fail_times": 1},
                                       "retries": {"max": 1, "backoff": 1}}]}

    async def go() -> Any:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(),
                                                          tools=recorder.toolbox()) as engine:
            run = await engine.start(doc)
            await run.wait()
            return run

    run = run_virtual(go())
    events = journal_at.events(run.id)
    plan = validate_plan(parse_plan_document(doc))
    replay = RunState(run.id, plan, events[0].data["idempotent"])
    for e in events:
        replay.apply(e)
    assert replay.summary() == run.state.summary()


def test_interrupted_run_resumes_without_redoing_finished_steps(recorder: Recorder, journal_at: JournalAt) -> None:
    tools = recorder.toolbox()

    async def interrupted() -> str:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=tools) as engine:
            run = await engine.start(CHAIN)
            await asyncio.sleep(2)
            return run.id  # leaving the engine interrupts the run: nothing recorded as finished

    run_id = run_virtual(interrupted())
    assert recorder.calls == ["a", "b", "c"]

    async def resume(retry_unknown: bool) -> Any:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=tools) as engine:
            run = await engine.resume(run_id, retry_unknown=retry_unknown)
            return await run.wait()

    first = run_virtual(resume(False))
    # b is idempotent (the tool's default) and re-ran; c is not and is unknown; d waits for c.
    assert recorder.calls == ["a", "b", "c", "b"]
    assert first.status == "failed"
    assert first.summary["steps"]["c"]["status"] == "unknown"
    assert first.summary["steps"]["d"]["status"] == "pending"
    assert "--retry-unknown" in (first.error or "")
    second = run_virtual(resume(True))
    assert second.ok
    assert recorder.calls == ["a", "b", "c", "b", "c", "d"]
    assert second.outputs["a"] == {"name": "a"}  # reused from the journal, not recomputed


def test_resume_of_a_finished_run_is_refused(journal_at: JournalAt) -> None:
    async def go() -> None:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock()) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "noop"}]})
            await run.wait()
            with pytest.raises(RunError, match="already ended: succeeded"):
                await engine.resume(run.id)

    run_virtual(go())


def test_many_runs_share_capacities(recorder: Recorder) -> None:
    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox(),
                          capacities={"gpu": 1}) as engine:
            runs = [
                await engine.start({"steps": [{"id": "x", "tool": "work", "args": {"name": f"r{i}", "seconds": 1},
                                               "resources": {"gpu": 1}}]})
                for i in range(3)
            ]
            return [await r.wait() for r in runs], asyncio.get_running_loop().time()

    results, t = run_virtual(go())
    assert all(r.ok for r in results)
    assert t == 3.0 and recorder.peak == 1


def test_engine_must_be_open() -> None:
    async def go() -> None:
        engine = Engine(MemoryJournal(), tools=builtin_tools())
        with pytest.raises(RunError, match="not open"):
            await engine.start({"steps": []})

    run_virtual(go())


def test_errors_inside_the_engine_block_propagate_unwrapped() -> None:
    from planweave import PlanInvalid

    async def go() -> None:
        async with Engine(MemoryJournal(), clock=VirtualClock()) as engine:
            await engine.start({"steps": [{"id": "a", "tool": "nope"}]})

    with pytest.raises(PlanInvalid, match="unknown tool 'nope'"):
        run_virtual(go())


def test_a_runs_priority_is_journaled_and_a_resume_keeps_it(journal_at: JournalAt) -> None:
    from planweave import current_step

    seen: dict[str, float] = {}
    gate, holding = asyncio.Event(), asyncio.Event()
    box = builtin_tools()

    async def mark(name: str, hold: bool = False) -> str:
        seen[name] = current_step().priority  # what the step's model calls queue by
        if hold:
            holding.set()
            await gate.wait()
        return name

    box.add(mark, idempotent=True)
    doc = {"steps": [{"id": "a", "tool": "mark", "args": {"name": "a"}},
                     {"id": "b", "tool": "mark", "args": {"name": "b", "hold": True}, "after": ["a"]}]}

    async def interrupted() -> str:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(doc, priority=2.5)
            plain = await engine.start({"steps": [{"id": "p", "tool": "mark", "args": {"name": "p"}}]})
            await plain.wait()
            await holding.wait()
            return run.id

    run_id = run_virtual(interrupted())
    assert seen == {"a": 2.5, "p": 0.0, "b": 2.5}
    created = [e for e in journal_at.events() if e.kind == "run_created"]
    assert [e.data["options"].get("priority") for e in created] == [2.5, None]  # none journaled when not given
    gate.set()
    seen.clear()

    async def resumed() -> tuple[float, Any]:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=box) as engine:
            run = await engine.resume(run_id)
            return run.priority, await run.wait()

    priority, result = run_virtual(resumed())
    assert result.status == "succeeded" and priority == 2.5 and seen == {"b": 2.5}
