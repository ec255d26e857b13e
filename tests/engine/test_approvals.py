"""People in the run: approval steps and ``human.input`` wait durably, and answers apply live or after a resume."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import (
    Engine,
    Event,
    InputRejected,
    ReplyRefused,
    Run,
    RunError,
    RunResult,
    VirtualClock,
    run_virtual,
    send_approval,
    send_input,
)
from planweave.core.state import RunState
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import Recorder


def w(name: str, seconds: float = 1, **extra: Any) -> dict[str, Any]:
    return {"id": name, "tool": "work", "args": {"name": name, "seconds": seconds}, **extra}


GATED = {"steps": [
    w("build"),
    w("deploy", approval="Deploy to production?", after=["build"]),
    w("notify", after=["deploy"]),
]}


def drive(
    journal: MemoryJournal, recorder: Recorder, doc: dict[str, Any], act: Callable[[Run], Awaitable[None]],
    **engine: Any,
) -> tuple[RunResult, dict[str, Any]]:
    """Start ``doc``, let ``act`` play the person (it may record observations), return the result and them."""
    seen: dict[str, Any] = {}

    async def go() -> RunResult:
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox(), **engine) as eng:
            run = await eng.start(doc)
            seen["run"] = run
            await act(run)
            return await run.wait()

    return run_virtual(go()), seen


def replayed(journal: MemoryJournal, run_id: str) -> RunState:
    return RunState.from_events(run_id, run_virtual(journal.read(run_id)))


def test_approval_step_waits_holding_nothing_then_runs_when_approved(recorder: Recorder) -> None:
    journal = MemoryJournal()
    observed: dict[str, Any] = {}

    async def person(run: Run) -> None:
        await asyncio.sleep(30)
        observed["status"] = run.state.records["deploy"].status
        observed["prompt"] = run.state.summary()["steps"]["deploy"].get("prompt")
        observed["counts"] = run.state.counts()
        observed["started"] = "deploy" in recorder.starts
        await run.approve("deploy", reason="looks good")

    result, _ = drive(journal, recorder, GATED, person, concurrency=1)
    assert observed == {"status": "waiting_approval", "prompt": "Deploy to production?",
                        "counts": {"succeeded": 1, "waiting_approval": 1, "pending": 1}, "started": False}
    assert result.ok
    assert recorder.starts["deploy"] == [30.0]  # not before the approval, at once after it
    kinds = [e.kind for e in run_virtual(journal.read(result.run_id)) if e.step == "deploy"]
    assert kinds[:3] == ["approval_requested", "approval_given", "step_started"]
    assert replayed(journal, result.run_id).summary() == result.state.summary()


def test_a_waiting_step_holds_no_concurrency_slot(recorder: Recorder) -> None:
    doc = {"steps": [w("gate", 1, approval=True), w("other", 2)]}

    async def person(run: Run) -> None:
        await asyncio.sleep(10)
        await run.approve("gate")

    result, _ = drive(MemoryJournal(), recorder, doc, person, concurrency=1)
    assert result.ok
    assert recorder.starts == {"other": [0.0], "gate": [10.0]}


def test_rejected_step_fails_as_rejected_is_never_retried_and_stops_the_run(recorder: Recorder) -> None:
    doc = {"steps": [w("gate", approval=True, retries=3), w("after", after=["gate"]), w("side", 100)]}

    async def person(run: Run) -> None:
        await asyncio.sleep(5)
        await run.approve("gate", approve=False, reason="not today")

    journal = MemoryJournal()
    result, _ = drive(journal, recorder, doc, person)
    steps = result.summary["steps"]
    assert result.status == "failed" and "step 'gate' failed: rejected: not today" in (result.error or "")
    assert steps["gate"]["status"] == "failed" and steps["gate"]["attempts"] == 0
    assert result.state.records["gate"].error_kind == "rejected"
    assert "gate" not in recorder.starts and steps["after"]["status"] == "skipped"
    assert steps["side"]["status"] == "cancelled" and result.state.finished_at == 5.0
    assert replayed(journal, result.run_id).summary() == result.state.summary()


def test_rejected_step_runs_its_fallback_without_asking_again(recorder: Recorder) -> None:
    doc = {"steps": [w("gate", approval=True, fallback={"tool": "work", "args": {"name": "plan_b"}})]}

    async def person(run: Run) -> None:
        await asyncio.sleep(1)
        await run.approve("gate", approve=False)

    result, _ = drive(MemoryJournal(), recorder, doc, person)
    assert result.ok and result.outputs["gate"] == {"name": "plan_b"}
    assert [e["rung"] for e in result.state.escalations] == ["fallback"]


def test_the_step_timeout_bounds_an_approval_wait(recorder: Recorder) -> None:
    async def nobody(run: Run) -> None:
        return None

    result, _ = drive(MemoryJournal(), recorder, {"steps": [w("gate", approval=True, timeout=7)]}, nobody)
    rec = result.state.records["gate"]
    assert (rec.status, rec.error_kind, rec.error, rec.finished_at) == ("failed", "timeout",
                                                                        "no approval within 7s", 7.0)


def test_answers_name_the_problem(recorder: Recorder) -> None:
    errors: list[str] = []

    async def person(run: Run) -> None:
        calls: tuple[Callable[[], Awaitable[None]], ...] = (
            lambda: run.approve("deplyo"), lambda: run.approve("build"), lambda: run.send("deploy", 1))
        for call in calls:
            try:
                await call()
            except RunError as exc:
                errors.append(str(exc))
        await asyncio.sleep(2)
        await run.approve("deploy")

    result, seen = drive(MemoryJournal(), recorder, GATED, person)
    assert result.ok
    rid = result.run_id
    assert errors == [
        f"run '{rid}' has no step 'deplyo' (did you mean 'deploy'?)",
        f"step 'build' of run '{rid}' is not waiting for an approval (it is running)",
        f"step 'deploy' of run '{rid}' is not waiting for a value (it is pending)",
    ]
    with pytest.raises(RunError, match="is not running"):
        asyncio.run(seen["run"].approve("notify"))
    with pytest.raises(ReplyRefused, match="already has a reply, and the first reply is final: approved by "):
        asyncio.run(seen["run"].approve("deploy", approve=False))  # the run ended, and the approval it had stands


ASK = {"steps": [
    {"id": "ask", "tool": "human.input", "args": {"prompt": "How many?", "schema": {"type": "integer", "minimum": 1}}},
    {"id": "use", "tool": "noop", "args": {"n": "${ask}"}},
]}


def test_human_input_refuses_a_bad_value_and_the_good_one_becomes_the_output(recorder: Recorder) -> None:
    observed: list[Any] = []

    async def person(run: Run) -> None:
        await asyncio.sleep(3)
        observed.append(run.state.records["ask"].status)
        for bad in ("three", 0):
            try:
                await run.send("ask", bad)
            except InputRejected as exc:
                observed.append(str(exc))
        observed.append(run.state.records["ask"].status)
        await run.send("ask", 3)

    journal = MemoryJournal()
    result, _ = drive(journal, recorder, ASK, person)
    rid = result.run_id
    assert observed == [
        "waiting_input",
        f"run '{rid}', step 'ask': the value is refused: 'three' is not of type 'integer'",
        f"run '{rid}', step 'ask': the value is refused: 0 is less than the minimum of 1",
        "waiting_input",
    ]
    assert result.ok and result.outputs == {"ask": 3, "use": {"n": 3}}
    requested = [e for e in run_virtual(journal.read(rid)) if e.kind == "input_requested"]
    assert requested[0].data == {"prompt": "How many?", "schema": {"type": "integer", "minimum": 1}}
    assert replayed(journal, rid).summary() == result.state.summary()


def test_human_input_refuses_an_invalid_schema() -> None:
    doc = {"steps": [{"id": "ask", "tool": "human.input", "args": {"prompt": "?", "schema": {"type": "nope"}}}]}

    async def go() -> RunResult:
        async with Engine(MemoryJournal(), clock=VirtualClock()) as eng:
            return await (await eng.start(doc)).wait()

    result = run_virtual(go())
    assert result.state.records["ask"].error_kind == "arguments"
    assert "schema is not a valid JSON schema" in (result.state.records["ask"].error or "")


def interrupted_then_answered(
    doc: dict[str, Any], answer: Callable[[MemoryJournal, str], Awaitable[str]], recorder: Recorder,
) -> tuple[RunResult, list[str], str, str]:
    """Run ``doc`` until it waits, close the engine (an interruption), answer through the journal, resume."""
    journal = MemoryJournal()

    async def go() -> tuple[RunResult, list[str], str, str]:
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as eng:
            run = await eng.start(doc)
            await asyncio.sleep(5)
            waiting: list[str] = list(run.state.waiting_steps().values())
        how = await answer(journal, run.id)
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as eng:
            resumed = await eng.resume(run.id)
            status = next(iter(resumed.state.records[s].status for s in resumed.state.waiting_steps()), "none")
            return await resumed.wait(), waiting, how, status

    return run_virtual(go())


def test_an_approval_journaled_while_no_process_runs_the_run_applies_on_resume(recorder: Recorder) -> None:
    result, waiting, how, _ = interrupted_then_answered(
        GATED, lambda j, rid: send_approval(j, rid, "deploy", approve=True), recorder)
    assert waiting == ["waiting_approval"]
    # The run's owner (this test process) is alive but no longer runs it: nobody confirms, so the reply, which
    # stands, is reported pending, and the resume applies it.
    assert how == "pending"
    assert result.ok and recorder.calls == ["build", "deploy", "notify"]


def test_a_value_journaled_while_no_process_runs_the_run_applies_on_resume(recorder: Recorder) -> None:
    async def bad_then_good(journal: MemoryJournal, rid: str) -> str:
        with pytest.raises(InputRejected, match="is not of type 'integer'"):
            await send_input(journal, rid, "ask", "many")
        with pytest.raises(RunError, match="is not waiting for a value"):
            await send_input(journal, rid, "use", 1)
        return await send_input(journal, rid, "ask", 4)

    result, waiting, _, _ = interrupted_then_answered(ASK, bad_then_good, recorder)
    assert waiting == ["waiting_input"]
    assert result.ok and result.outputs["use"] == {"n": 4}


def test_a_resumed_run_still_waits_and_its_deadline_counts_from_the_request(recorder: Recorder) -> None:
    async def nothing(journal: MemoryJournal, rid: str) -> str:
        return "none"

    doc = {"steps": [w("gate", approval=True, timeout=60)]}
    result, waiting, _, status = interrupted_then_answered(doc, nothing, recorder)
    assert waiting == ["waiting_approval"] and status == "waiting_approval"
    rec = result.state.records["gate"]
    assert rec.error_kind == "timeout"
    # requested at 0 by the first process; the second one's virtual clock restarts at 0: 60 s after the request
    assert rec.finished_at == 60.0


def test_answers_through_the_journal_are_refused_for_unknown_runs_and_ended_runs(recorder: Recorder) -> None:
    journal = MemoryJournal()

    async def person(run: Run) -> None:
        await asyncio.sleep(1)
        await run.approve("deploy")

    result, _ = drive(journal, recorder, GATED, person)

    async def go() -> list[str]:
        out = []
        for coro in (send_approval(journal, "nope", "x", approve=True),
                     send_approval(journal, result.run_id, "deploy", approve=True)):
            try:
                await coro
            except RunError as exc:
                out.append(str(exc))
        return out

    assert run_virtual(go()) == [f"no run 'nope' in the journal {journal.url}",
                                 f"run '{result.run_id}' already ended: succeeded"]


# -- property: random plans with approvals and random decisions ----------------------------------------------------
@st.composite
def gated_plans(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, tuple[float, bool]], float]:
    n = draw(st.integers(2, 8))
    steps = []
    decisions: dict[str, tuple[float, bool]] = {}
    for i in range(n):
        after = sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))) if i else []
        step = w(f"s{i}", draw(st.integers(0, 3)), after=[f"s{j}" for j in after])
        if draw(st.booleans()):
            step["approval"] = True
            decisions[f"s{i}"] = (float(draw(st.integers(0, 5))), draw(st.booleans()))
        steps.append(step)
    return {"steps": steps, "on_failure": "continue"}, decisions, float(draw(st.integers(0, 12)))


def decided(run: Run, decisions: dict[str, tuple[float, bool]], log: list[tuple[str, str]]) -> None:
    """Play the approvers: each request is answered after its delay; record (kind, step) of the events."""
    loop = asyncio.get_running_loop()

    def answer(step: str) -> None:
        delay, ok = decisions[step]
        loop.call_later(delay, lambda: asyncio.ensure_future(run.approve(step, ok)) if not run.finished else None)

    def listen(event: Event) -> None:
        if event.step is not None:
            log.append((event.kind, event.step))
        if event.kind == "approval_requested" and event.step is not None:
            answer(event.step)

    run.subscribe(listen)
    for step in run.state.waiting_steps():  # after a resume: the requests are older than this process
        answer(step)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gated_plans())
def test_approval_runs_terminate_gate_their_steps_and_resume_to_the_same_values(
    case: tuple[dict[str, Any], dict[str, tuple[float, bool]], float],
) -> None:
    doc, decisions, cut = case
    recorder = Recorder()

    async def live() -> tuple[RunResult, list[tuple[str, str]]]:
        log: list[tuple[str, str]] = []
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as eng:
            run = await eng.start(doc)
            decided(run, decisions, log)
            return await run.wait(), log

    async def cut_and_resumed() -> RunResult:
        journal = MemoryJournal()
        async with Engine(journal, clock=VirtualClock(), tools=Recorder().toolbox()) as eng:
            run = await eng.start(doc)
            decided(run, decisions, [])
            await asyncio.sleep(cut)
            if run.finished:
                return await run.wait()
        async with Engine(journal, clock=VirtualClock(), tools=Recorder().toolbox()) as eng:
            resumed = await eng.resume(run.id)
            decided(resumed, decisions, [])
            return await resumed.wait()

    result, log = run_virtual(live())
    assert result.status in ("succeeded", "failed")
    for step, (_, ok) in decisions.items():
        kinds = [k for k, s in log if s == step]
        if "step_started" in kinds:
            assert ok and kinds.index("approval_given") < kinds.index("step_started")
    assert not any(name in recorder.starts for name, (_, ok) in decisions.items() if not ok)
    again = run_virtual(cut_and_resumed())
    assert again.status == result.status
    assert again.outputs == result.outputs
    assert {s: r["status"] for s, r in again.summary["steps"].items()} == \
           {s: r["status"] for s, r in result.summary["steps"].items()}
