"""A journal that keeps nothing (``null://``) with nobody listening: the run does not build what only readers of
its events would use (the plan's document in ``run_created``, a call per event to ``append``), and runs the same."""

from __future__ import annotations

from typing import Any

import pytest

from planweave import Event, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.core.plan.graph import Plan

PLAN = {"steps": [
    {"id": "a", "tool": "noop", "args": {"x": 1}},
    {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}, "timeout": None},
]}


def run(url: str, *, on_event: bool = False, subscribe: bool = False) -> tuple[str, dict[str, Any], list[Event]]:
    seen: list[Event] = []

    async def go() -> tuple[str, dict[str, Any]]:
        async with open_engine(url, clock=VirtualClock(), tools=builtin_tools()) as engine:
            if subscribe:
                engine.subscribe(seen.append)
            started = await engine.start(PLAN, on_event=seen.append if on_event else None)
            result = await started.wait()
            return result.status, dict(result.outputs)

    status, outputs = run_virtual(go())
    return status, outputs, seen


@pytest.fixture
def documents(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a plan's document was built (recorded here, asserted after the run)."""
    built: list[int] = []
    original = Plan.to_document

    def counting(self: Plan) -> dict[str, Any]:
        built.append(1)
        return original(self)

    monkeypatch.setattr(Plan, "to_document", counting)
    return built


def test_null_journal_without_listeners_builds_no_document(documents: list[int]) -> None:
    status, outputs, _ = run("null://")
    assert status == "succeeded"
    assert outputs == {"a": {"x": 1}, "b": {"y": 1}}
    assert documents == []


@pytest.mark.parametrize(("url", "on_event", "subscribe"), [
    ("null://", True, False), ("null://", False, True), ("memory://", False, False),
])
def test_anyone_reading_the_events_gets_the_document(documents: list[int], url: str, on_event: bool,
                                                      subscribe: bool) -> None:
    status, outputs, seen = run(url, on_event=on_event, subscribe=subscribe)
    assert status == "succeeded"
    assert outputs == {"a": {"x": 1}, "b": {"y": 1}}
    assert documents == [1]
    if seen:
        created = seen[0]
        assert created.kind == "run_created"
        assert isinstance(created.data["plan"], dict)
        assert created.data["plan"]["steps"][1]["timeout"] is None  # the explicit null survives, as journaled
        assert [e.kind for e in seen].count("step_succeeded") == 2


# -- the events nobody sees: a step's start and success folded without building them ---------------------------

FAILS_ONCE = {"steps": [
    {"id": "a", "tool": "sleep", "args": {"seconds": 1, "result": {"n": 1}}},
    {"id": "flaky", "tool": "once", "args": {"key": "${a.n}"}, "retries": {"max": 2, "backoff": 2}},
    {"id": "b", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["a"]},
    {"id": "c", "tool": "noop", "after": ["flaky", "b"]},
    {"id": "bad", "tool": "once", "args": {"key": -1}, "retries": {"max": 0}},
    {"id": "d", "tool": "noop", "after": ["bad"]},
]}


def folded(url: str, *, listen: bool) -> tuple[str, list[tuple[Any, ...]], tuple[int, int]]:
    """Each step's record after a run of FAILS_ONCE (a retry, a final failure, a skipped dependent)."""
    calls: dict[Any, int] = {}

    async def once(key: int) -> dict[str, Any]:
        calls[key] = calls.get(key, 0) + 1
        if key < 0 or calls[key] == 1:
            raise RuntimeError(f"attempt {calls[key]} of {key} fails")
        return {"key": key}

    async def go() -> tuple[str, list[tuple[Any, ...]], tuple[int, int]]:
        box = builtin_tools()
        box.add(once)
        async with open_engine(url, clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(FAILS_ONCE, on_failure="continue", run_id="same",
                                     on_event=(lambda event: None) if listen else None)
            result = await run.wait()
            records = [(r.id, r.status, r.attempts, r.started_at, r.finished_at, r.output_ref, r.error,
                        list(r.attempt_log)) for r in run.state.records.values()]
            return result.status, records, (run.state.active, run.state.events_applied)

    return run_virtual(go())


def test_a_run_nobody_sees_folds_to_the_state_its_events_give() -> None:
    quiet = folded("null://", listen=False)  # started and succeeded folded without their events
    assert quiet[0] == "failed"
    assert {r[0]: r[1] for r in quiet[1]} == {"a": "succeeded", "flaky": "succeeded", "b": "succeeded",
                                               "c": "succeeded", "bad": "failed", "d": "skipped"}
    assert {r[0]: r[2] for r in quiet[1]}["flaky"] == 2
    assert folded("null://", listen=True) == quiet  # the same run through its events
    stored = folded("memory://", listen=False)  # a journal that keeps the outputs: their references differ
    assert [r[:5] + r[6:] for r in stored[1]] == [r[:5] + r[6:] for r in quiet[1]]
    assert (stored[0], stored[2]) == (quiet[0], quiet[2])
