"""The step state machine: the fold refuses transitions it does not allow, naming run, step and states."""

from __future__ import annotations

import pytest

from planweave import Event, JournalError, parse_plan_document, validate_plan
from planweave.engine.state import TRANSITIONS, RunState


def state() -> RunState:
    plan = validate_plan(parse_plan_document({"steps": [{"id": "a", "tool": "noop"},
                                                        {"id": "b", "tool": "noop", "after": ["a"]}]}))
    s = RunState("r1", plan, ["a", "b"])
    s.apply(Event("r1", "run_created", 0.0, None, {}))
    return s


def test_a_step_cannot_succeed_before_it_started() -> None:
    s = state()
    with pytest.raises(JournalError, match="moves step 'a' from ready to succeeded"):
        s.apply(Event("r1", "step_succeeded", 1.0, "a", {"attempt": 1}))


def test_a_waiting_step_cannot_start() -> None:
    s = state()
    with pytest.raises(JournalError, match="moves step 'b' from pending to running"):
        s.apply(Event("r1", "step_started", 1.0, "b", {"attempt": 1}))


def test_the_happy_path_and_counts() -> None:
    s = state()
    assert s.active == 1
    s.apply(Event("r1", "step_started", 1.0, "a", {"attempt": 1}))
    ready = s.apply(Event("r1", "step_succeeded", 2.0, "a", {"attempt": 1, "output": "x"}))
    assert list(ready) == ["b"] and s.active == 1
    assert s.records["a"].attempt_log == [(1, 1.0, 2.0, "succeeded")]


def test_terminal_states_have_no_way_out() -> None:
    for status in ("succeeded", "failed", "cancelled", "skipped"):
        assert TRANSITIONS[status] == frozenset()
