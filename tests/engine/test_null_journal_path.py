"""A journal that keeps nothing (``null://``) with nobody listening: the run does not build what only readers of
its events would use (the plan's document in ``run_created``, a call per event to ``append``), and runs the same."""

from __future__ import annotations

from typing import Any

import pytest

from planweave import Event, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.plan.graph import Plan

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
