"""A run whose outcome is decided stops (``on_failure: stop``, the default for plans); ``continue`` runs on."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import Engine, RunResult, VirtualClock, run_virtual
from planweave.core.state import RunState
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import JournalAt, Recorder

# The only sink needs 'bad', which fails at t=1; 'long' is a 40 s branch whose work nobody will use.
DOOMED = {"steps": [
    {"id": "bad", "tool": "work", "args": {"name": "bad", "seconds": 1, "fail_times": 9}},
    {"id": "long", "tool": "work", "args": {"name": "long", "seconds": 40}},
    {"id": "later", "tool": "work", "args": {"name": "later", "seconds": 1}, "after": ["long"]},
    {"id": "sink", "tool": "work", "args": {"name": "sink"}, "after": ["bad", "later"]},
]}


def run(doc: dict[str, Any], recorder: Recorder, journal: JournalAt | None = None, **start: Any) -> RunResult:
    async def go() -> RunResult:
        async with (journal or JournalAt("memory://", MemoryJournal())).open() as opened, Engine(
            opened, clock=VirtualClock(), tools=recorder.toolbox()
        ) as engine:
            return await (await engine.start(doc, **start)).wait()

    return run_virtual(go())


def test_a_doomed_run_stops_right_after_the_failure(recorder: Recorder, journal_at: JournalAt) -> None:
    result = run(DOOMED, recorder, journal_at)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("step 'bad' failed: ConnectionError: bad flaked")
    assert result.state.finished_at == 1.0  # not 41: the 40 s branch was cancelled
    steps = result.summary["steps"]
    assert steps["long"]["status"] == "cancelled"
    assert steps["long"]["error"] == "the run stopped: step 'bad' failed and nothing can repair it"
    assert steps["later"]["status"] == "pending" and "later" not in recorder.starts  # nothing new started
    assert steps["sink"]["status"] == "skipped"
    events = journal_at.events(result.run_id)
    assert RunState.from_events(result.run_id, events).summary() == result.state.summary()


def test_a_resume_reruns_the_steps_a_stop_cancelled(recorder: Recorder, journal_at: JournalAt) -> None:
    first = run(DOOMED, recorder, journal_at)

    async def go() -> RunResult:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(),
                                                          tools=recorder.toolbox()) as engine:
            return await (await engine.resume(first.run_id)).wait()

    again = run_virtual(go())
    steps = again.summary["steps"]
    assert (steps["long"]["status"], steps["later"]["status"]) == ("succeeded", "succeeded")
    assert steps["bad"]["status"] == "failed" and again.status == "failed"
    assert recorder.starts["long"] == [0.0, 0.0]  # ran again from the start in the second process


def test_continue_keeps_every_independent_result(recorder: Recorder) -> None:
    result = run({**DOOMED, "on_failure": "continue"}, recorder)
    assert result.status == "failed" and result.state.finished_at == 41.0
    assert result.summary["steps"]["later"]["status"] == "succeeded"


def test_a_held_run_continues_because_its_planner_may_repair_the_failure(recorder: Recorder) -> None:
    async def go() -> tuple[RunResult, float, str]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            started = await engine.start(DOOMED, hold=True)
            await asyncio.sleep(2)
            status = started.state.records["long"].status
            started.release()
            return await started.wait(), asyncio.get_running_loop().time(), status

    result, t, status = run_virtual(go())
    assert status == "running" and t == 41.0 and result.summary["steps"]["later"]["status"] == "succeeded"


def test_the_start_argument_overrides_the_plan(recorder: Recorder) -> None:
    result = run({**DOOMED, "on_failure": "continue"}, recorder, on_failure="stop")
    assert result.state.finished_at == 1.0


def test_a_step_with_a_fallback_does_not_stop_the_run(recorder: Recorder) -> None:
    steps = [dict(DOOMED["steps"][0], fallback={"tool": "work", "args": {"name": "plan_b"}}), *DOOMED["steps"][1:]]
    result = run({"steps": steps}, recorder)
    assert result.ok and result.state.finished_at == 41.0


def test_a_stop_cancels_steps_waiting_for_a_person_too(recorder: Recorder) -> None:
    doc = {"steps": [DOOMED["steps"][0], {"id": "gate", "tool": "work", "args": {"name": "gate"}, "approval": True},
                     {"id": "ask", "tool": "human.input", "args": {"prompt": "?"}}]}
    result = run(doc, recorder)
    assert result.state.finished_at == 1.0
    assert {s: r["status"] for s, r in result.summary["steps"].items()} == {
        "bad": "failed", "gate": "cancelled", "ask": "cancelled"}
