"""Plan versions while the run continues: streaming admission and splicing by state matching."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Engine, PlanInvalid, VirtualClock, run_virtual
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.plan.model import PlanSpec
from planweave.core.splice import StaleProposal
from planweave.core.state import RunState
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import JournalAt, Recorder


def w(sid: str, seconds: float, name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "work", "args": {"name": name or sid, "seconds": seconds}, **extra}


def replay(journal: MemoryJournal | JournalAt, run_id: str) -> RunState:
    events = journal.events(run_id) if isinstance(journal, JournalAt) else run_virtual(journal.read(run_id))
    raw = events[0].data["plan"]
    plan = validate_plan(raw if isinstance(raw, PlanSpec) else parse_plan_document(raw))
    state = RunState(run_id, plan, events[0].data["idempotent"])
    for e in events:
        state.apply(e)
    return state


def test_streamed_steps_start_before_the_plan_is_complete(recorder: Recorder) -> None:
    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": []}, hold=True)  # the planner is still writing
            run.extend([w("a", 2)], trigger="initial", model_started_at=0.0)
            await asyncio.sleep(1)  # the model takes a second to write the next line
            run.extend([w("b", 1, after=["a"]), w("c", 1)])
            await asyncio.sleep(5)
            run.extend([], model_finished_at=6.0)
            run.release()
            return await run.wait()

    result = run_virtual(go())
    assert result.ok
    assert recorder.starts == {"a": [0.0], "c": [1.0], "b": [2.0]}
    versions = result.state.versions
    assert versions[-1]["added"] == ["a", "b", "c"] and versions[-1]["model_finished_at"] == 6.0


def test_extend_rejects_bad_lines_and_keeps_what_was_done(recorder: Recorder) -> None:
    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": [w("a", 1)]})
            with run.hold():
                with pytest.raises(PlanInvalid) as info:
                    run.extend([{"id": "b", "tool": "work", "args": {"name": "b", "x": "${nope}"}}])
                assert "refers to unknown step 'nope'" in str(info.value)
                with pytest.raises(PlanInvalid, match="unknown tool 'wrok'"):
                    run.extend([{"id": "c", "tool": "wrok"}])
                run.extend([w("d", 1, after=["a"])])
            return await run.wait()

    result = run_virtual(go())
    assert result.ok and set(result.summary["steps"]) == {"a", "d"}


def test_splice_keeps_finished_adopts_running_cancels_and_drops(recorder: Recorder, journal_at: JournalAt) -> None:
    async def go() -> Any:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(),
                                                          tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": [
                w("fetch", 1), w("slow", 10), w("doomed", 10), w("later", 1, after=["slow"]),
                w("report", 1, after=["fetch", "later"]),
            ]})
            await asyncio.sleep(2)  # fetch done; slow and doomed running; later and report waiting
            seen = run.position
            diff = run.propose({"steps": [
                w("slow2", 10, name="slow"),  # same work as 'slow' under a new id: adopted
                w("summary", 1, after=["fetch", "slow2"]),  # new, refers to the finished 'fetch'
                w("fetch_again", 1, name="fetch"),  # same as finished 'fetch': bound to its result
            ]}, seen=seen)
            result = await run.wait()
            return diff, result, run.id

    diff, result, run_id = run_virtual(go())
    assert diff.kept == ("fetch",)
    assert diff.adopted == ("slow",)
    assert set(diff.cancelled) == {"doomed"}
    assert set(diff.dropped) == {"later", "report"}
    assert diff.added == ("summary",)
    assert result.ok
    assert recorder.calls.count("fetch") == 1 and recorder.calls.count("slow") == 1
    assert "doomed" not in recorder.ends and "later" not in recorder.starts
    assert recorder.starts["summary"] == [10.0]  # right when the adopted step finished
    assert set(result.summary["steps"]) == {"fetch", "slow", "summary"}
    assert result.state.versions[-1]["renamed"] == {"slow2": "slow", "fetch_again": "fetch"}
    assert replay(journal_at, run_id).summary() == result.state.summary()


def test_proposal_depending_on_a_failed_step_is_stale(recorder: Recorder, journal_at: JournalAt) -> None:
    async def go() -> None:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(),
                                                          tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": [
                {"id": "bad", "tool": "work", "args": {"name": "bad", "fail_times": 9}}, w("long", 5),
            ], "on_failure": "continue"})
            seen = run.position
            await asyncio.sleep(1)  # 'bad' failed meanwhile
            with pytest.raises(StaleProposal, match=r"'bad' \(failed\)") as info:
                run.propose({"steps": [w("use", 1, after=["bad"])]}, seen=seen)
            assert info.value.steps == ("bad",)
            with pytest.raises(StaleProposal, match="events happened since"):
                run.propose({"steps": [w("x", 1)]}, seen=seen, max_staleness=0)
            # Re-running the failed step under its own id is fine: it is new work.
            diff = run.propose({"steps": [w("bad", 1, name="bad2"), w("use", 1, after=["bad"])]}, seen=seen)
            assert set(diff.added) == {"bad", "use"} and diff.cancelled == ("long",)
            await run.wait()

    run_virtual(go())


@st.composite
def scenarios(draw: st.DrawFn) -> list[Any]:
    n = draw(st.integers(2, 8))
    # One duration per name: a step restated with other arguments would be other work, which may rightly run again.
    # Same for dependencies: they are part of a step's fingerprint, so a restated step keeps its `after`.
    seconds = [draw(st.sampled_from([1, 2, 3])) for _ in range(n + 4)]
    after: list[list[str]] = [[] for _ in range(n + 4)]
    plan = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else []
        after[i] = [f"s{p}" for p in parents]
        plan.append(w(f"s{i}", seconds[i], after=after[i]))
    proposals = []
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from([0.5, 1.5, 2.5, 4]))
        steps = []
        for i in draw(st.lists(st.integers(0, n + 3), max_size=6, unique=True)):
            steps.append(w(f"s{i}", seconds[i], name=f"s{i}" if i < n else f"new{i}", after=after[i]))
        proposals.append((at, steps))
    return [plan, proposals]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_splices_never_lose_a_finished_result_or_run_a_step_twice(case: list[Any]) -> None:
    plan, proposals = case
    recorder = Recorder()
    journal = MemoryJournal()

    async def go() -> Any:
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": plan})
            finished_before: dict[str, Any] = {}
            with run.hold():
                now = 0.0
                for at, steps in sorted(proposals, key=lambda p: p[0]):
                    await asyncio.sleep(at - now)
                    now = at
                    finished_before.update({k: run.outputs[k] for k, r in run.state.records.items()
                                            if r.status == "succeeded"})
                    try:
                        run.propose({"steps": steps}, seen=run.position)
                    except (PlanInvalid, StaleProposal):
                        pass
            result = await run.wait()
            return run, result, finished_before

    run, result, finished_before = run_virtual(go())
    # A finished step still in the plan keeps its result; no step's work ran twice while succeeded.
    for sid, out in finished_before.items():
        if sid in result.state.records and result.state.records[sid].status == "succeeded":
            assert result.outputs[sid] == out
    ran_twice = {name: times for name, times in recorder.successes.items() if len(times) > 1}
    assert ran_twice == {}, f"work that succeeded ran again: {ran_twice}"
    started_after_success = {name: [t for t in recorder.starts[name] if t >= times[0]]
                             for name, times in recorder.successes.items()}
    assert all(not late for late in started_after_success.values()), started_after_success
    assert result.status in ("succeeded", "failed")
    assert replay(journal, run.id).summary() == result.state.summary()


def test_a_proposal_may_refer_to_a_skipped_step_whose_failed_dependency_it_replaces(recorder: Recorder) -> None:
    """'use' was skipped because 'bad' failed; a re-plan that re-runs 'bad' and refers to 'use' without restating
    it revives 'use' instead of being refused as stale."""
    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": [
                {"id": "bad", "tool": "work", "args": {"name": "bad", "fail_times": 1}},
                w("use", 1, after=["bad"]), w("long", 5),
            ], "on_failure": "continue"})
            await asyncio.sleep(1)  # 'bad' failed, 'use' skipped, 'long' running
            assert run.state.records["use"].status == "skipped"
            with pytest.raises(StaleProposal, match=r"'bad' \(failed\)"):  # 'bad' itself is still needed
                run.propose({"steps": [w("report", 1, after=["use"])]})
            diff = run.propose({"steps": [{"id": "bad", "tool": "work", "args": {"name": "bad", "fail_times": 1}},
                                          w("report", 1, after=["use", "long"])]})
            return diff, await run.wait()

    diff, result = run_virtual(go())
    assert set(diff.added) == {"bad", "use", "report"} and diff.adopted == ("long",)
    assert result.ok, result.error
    assert recorder.starts["use"] == [recorder.ends["bad"]]  # ran once, after the re-run of 'bad'
