"""The step state machine: the fold refuses transitions it does not allow, naming run, step and states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from planweave import Event, JournalError, parse_plan_document, validate_plan
from planweave.core.events import PAYLOADS, EventKind
from planweave.core.state import _FOLD, TRANSITIONS, RunState


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


def test_every_event_kind_has_a_payload_type_and_a_handler() -> None:
    kinds = set(get_args(EventKind))
    assert set(PAYLOADS) == kinds
    assert set(_FOLD) == kinds


def test_an_unknown_event_kind_is_refused_naming_run_and_kind() -> None:
    s = state()
    with pytest.raises(JournalError, match="run 'r1': unknown event kind 'step_exploded'"):
        s.apply(Event("r1", "step_exploded", 1.0, "a", {}))


def test_a_person_event_naming_no_step_of_the_run_is_refused() -> None:
    s = state()
    with pytest.raises(JournalError, match="run 'r1': event approval_given names unknown step 'zz'"):
        s.apply(Event("r1", "approval_given", 1.0, "zz", {"approve": True}))


# A journal as the engine wrote it before the fold became a dispatch table (Event.to_json, one a line; every kind of
# event a run writes, plan and step documents included): the same bytes must still fold to the same state.
JOURNAL = Path(__file__).parent / "journals" / "before_dispatch_table.jsonl"


def journaled() -> list[Event]:
    return [Event(d["run_id"], d["kind"], d["at"], d["step"], d["data"], d["pos"])
            for d in (json.loads(line) for line in JOURNAL.read_text(encoding="utf-8").splitlines())]


def test_a_journal_written_before_the_dispatch_table_folds_to_the_same_state() -> None:
    s = RunState.from_events("r9", journaled())
    a, b, c, d = (s.records[x] for x in "abcd")
    assert (s.last_pos, s.events_applied, s.on_failure, s.idempotent) == (23, 23, "stop", frozenset({"a", "b"}))
    assert (s.created_at, s.status, s.finished_at, s.error, s.root_cause) == (0.0, "running", None, None, "d")
    assert (a.status, a.output_ref, a.progress, a.attempt_log) == ("succeeded", "blob-a", (0.5, "half"),
                                                                    [(1, 1.0, 2.0, "succeeded")])
    assert (b.status, b.attempts, b.fallback_active, b.retry_at, b.error, b.error_kind) == (
        "succeeded", 2, True, None, None, "tool")
    assert b.attempt_log == [(1, 2.0, 3.0, "failed"), (2, 3.5, 4.0, "succeeded")]
    assert (b.prompt, b.input_schema, b.reply, b.given, b.waiting_since) == (
        "which?", {"type": "string"}, None, None, None)
    # c was cancelled resumable by the stopping run: the resume makes it ready again, approved once.
    assert (c.status, c.approved, c.resumable, c.error, c.finished_at) == ("ready", True, False, None, None)
    assert c.attempt_log == [(1, 4.5, 5.0, "cancelled")]
    assert (d.status, d.error, d.finished_at) == ("failed", "nope", 5.0)
    assert (s.tokens, s.cost_usd, s.answer, s.active) == (15, 0.25, "partly", 1)
    assert s.model_calls == [{"purpose": "tool", "model": "m", "prompt_tokens": 10, "completion_tokens": 5,
                              "cost_usd": 0.25, "at": 1.6, "step": "a"}]
    assert s.escalations == [{"at": 3.0, "step": "b", "rung": "fallback", "reason": "boom", "tool": "noop"}]
    assert s.outcome() == ("failed", "step 'd' failed: nope")
    assert s.counts() == {"succeeded": 2, "ready": 1, "failed": 1}


def ev(kind: str, at: float, step: str | None = None, **data: Any) -> Event:
    return Event("r", kind, at, step, data)


def test_plan_versions_and_streamed_steps_rebase_the_records_and_record_each_version() -> None:
    plan = validate_plan(parse_plan_document({"steps": [
        {"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "after": ["a"]},
        {"id": "k", "tool": "noop"}, {"id": "w", "tool": "noop"}]}))
    s = RunState("r", plan, ["a"])
    assert s.apply(ev("run_created", 0.0)) == ["a", "k", "w"]
    for e in (ev("step_started", 1.0, "a", attempt=1), ev("step_failed", 2.0, "a", attempt=1, error="boom"),
              ev("step_started", 1.0, "k", attempt=1), ev("step_succeeded", 2.0, "k", attempt=1, output="o"),
              ev("step_started", 2.0, "w", attempt=1)):
        s.apply(e)
    old_a, old_b, kept = s.records["a"], s.records["b"], s.records["k"]
    assert (s.root_cause, old_b.status, old_b.error) == ("a", "skipped", "dependency 'a' failed")

    # A re-plan: a changed (it runs again), b comes back, k is kept, w (running) is cancelled, c is new.
    v2 = {"steps": [{"id": "a", "tool": "noop", "args": {"x": 1}}, {"id": "b", "tool": "noop", "after": ["a"]},
                    {"id": "k", "tool": "noop"}, {"id": "c", "tool": "noop", "after": ["k"]}]}
    ready = s.apply(ev("plan_version", 5.0, plan=v2, version=2, parent=1, trigger="repair", model_started_at=3.0,
                       model_finished_at=4.0, renamed={"x": "y"}, idempotent=["c"]))
    assert list(ready) == ["a", "c"]
    assert s.records["k"] is kept and s.records["a"] is not old_a
    assert {r.id: (r.status, r.error) for r in s.records.values()} == {
        "a": ("ready", None), "k": ("succeeded", None), "b": ("pending", None), "c": ("ready", None)}
    assert (s.root_cause, s.idempotent, s.active, s.waiting) == (
        None, frozenset({"a", "c"}), 2, {"a": 0, "k": 0, "b": 1, "c": 0})
    assert [(v, r.id, r.status, r.error, r.finished_at, r.attempt_log) for v, r in s.retired] == [
        (1, "a", "failed", "boom", 2.0, [(1, 1.0, 2.0, "failed")]),
        (1, "b", "skipped", "dependency 'a' failed", 2.0, []),
        (1, "w", "cancelled", "replaced by plan version 2", 5.0, [(1, 2.0, 5.0, "cancelled")]),
    ]
    assert s.versions[-1] == {
        "version": 2, "parent": 1, "trigger": "repair", "model_started_at": 3.0, "model_finished_at": 4.0,
        "spliced_at": 5.0, "renamed": {"x": "y"}, "added": ["a", "b", "c"], "kept": ["k"], "adopted": [],
        "unchanged": [], "cancelled": ["w"], "dropped": []}

    # Lines streamed for version 2 extend it and update its meta.
    assert list(s.apply(ev("steps_added", 6.0, steps=[{"id": "d", "tool": "noop", "after": ["c"]}], version=2,
                            trigger="stream", model_finished_at=5.5, idempotent=["d"]))) == []
    entry = s.versions[-1]
    assert (entry["trigger"], entry["model_started_at"], entry["model_finished_at"], entry["spliced_at"]) == (
        "stream", 3.0, 5.5, 5.0)
    assert (entry["added"], len(s.versions), s.plan.version, s.waiting["d"]) == (["a", "b", "c", "d"], 2, 2, 1)
    assert s.idempotent == frozenset({"a", "c", "d"})

    # Lines of a newer version that arrive before any step: a new entry, not spliced yet; then its first step.
    assert s.apply(ev("steps_added", 7.0, steps=[], version=3, trigger="late", model_started_at=6.5)) == ()
    assert s.versions[-1] == {"version": 3, "parent": 2, "trigger": "late", "model_started_at": 6.5,
                              "model_finished_at": None, "spliced_at": None, "added": [], "kept": [],
                              "adopted": [], "cancelled": [], "dropped": []}
    assert list(s.apply(ev("steps_added", 8.0, steps=[{"id": "e", "tool": "noop"}], version=3))) == ["e"]
    assert (s.versions[-1]["spliced_at"], s.versions[-1]["added"], s.plan.version) == (8.0, ["e"], 2)

    # A streamed step after one that failed for good is skipped at once, naming it; the failure stays the cause.
    s.apply(ev("step_started", 9.0, "e", attempt=1))
    s.apply(ev("step_failed", 10.0, "e", attempt=1, error="bad", final=True))
    assert s.apply(ev("steps_added", 11.0, steps=[{"id": "f", "tool": "noop", "after": ["e"]}], version=3)) == []
    f = s.records["f"]
    assert (f.status, f.error, f.finished_at, s.root_cause) == ("skipped", "dependency 'e' failed", 11.0, "e")
    assert s.counts() == {"ready": 2, "succeeded": 1, "pending": 2, "failed": 1, "skipped": 1}


def test_cancelling_a_step_or_the_run_records_why_and_when_and_skips_what_waits() -> None:
    plan = validate_plan(parse_plan_document({"steps": [
        {"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "after": ["a"]},
        {"id": "c", "tool": "noop", "after": ["b"]}, {"id": "r", "tool": "noop"}, {"id": "q", "tool": "noop"},
        {"id": "u", "tool": "noop"}, {"id": "p", "tool": "noop", "after": ["q"]}]}))
    s = RunState("r", plan, ())
    s.apply(ev("run_created", 0.0))
    for e in (ev("step_started", 1.0, "a", attempt=1), ev("step_started", 1.0, "r", attempt=1),
              ev("step_started", 1.0, "q", attempt=1), ev("step_succeeded", 2.0, "q", attempt=1, output="o"),
              ev("step_started", 1.0, "u", attempt=1), ev("run_resumed", 3.0)):  # u: not idempotent -> unknown
        s.apply(e)
    assert (s.records["u"].status, s.records["r"].status) == ("unknown", "unknown")
    assert s.apply(ev("step_cancelled", 4.0, "a", reason="not needed")) == ()
    a = s.records["a"]
    assert (a.status, a.error, a.finished_at) == ("cancelled", "not needed", 4.0)
    s2 = RunState("r", plan, ["a"])
    s2.apply(ev("run_created", 0.0))
    s2.apply(ev("step_started", 1.0, "a", attempt=1))
    s2.apply(ev("step_cancelled", 4.0, "a"))
    a2, b2, c2 = (s2.records[x] for x in "abc")
    assert (a2.status, a2.error, a2.finished_at, a2.resumable, a2.attempt_log) == (
        "cancelled", "cancelled", 4.0, False, [(1, 1.0, 4.0, "cancelled")])
    assert [(r.status, r.error, r.finished_at) for r in (b2, c2)] == [
        ("skipped", "dependency 'a' was cancelled", 4.0), ("skipped", "dependency 'a' was cancelled", 4.0)]
    s2.apply(ev("step_cancelled", 5.0, "a", reason="again"))  # a finished step: nothing changes
    s2.apply(ev("step_cancelled", 5.0, "b", reason="again"))  # a skipped one neither
    assert (a2.error, a2.finished_at) == ("cancelled", 4.0)
    assert (b2.status, b2.error) == ("skipped", "dependency 'a' was cancelled")
    s2.apply(ev("step_started", 5.0, "q", attempt=1))
    s2.apply(ev("step_failed", 5.0, "q", attempt=1, error="x"))
    s2.apply(ev("step_cancelled", 5.5, "q", reason="again"))  # nor a failed one
    assert (s2.records["q"].status, s2.records["q"].error) == ("failed", "x")
    s2.apply(ev("step_started", 1.0, "r", attempt=1))
    s2.apply(ev("step_cancelled", 6.0, "r", reason="stopping", resumable=True))  # dependents wait for the resume
    assert (s2.records["r"].status, s2.records["r"].error, s2.records["r"].resumable) == ("cancelled", "stopping", True)

    # The run: every step not finished is cancelled with the reason, its attempt closed; finished ones stay.
    assert s.apply(ev("run_cancelled", 7.0, reason="enough")) == ()
    got = {r.id: (r.status, r.error, r.finished_at) for r in s.records.values()}
    assert got["q"] == ("succeeded", None, 2.0)
    assert got["p"] == ("cancelled", "enough", 7.0)  # ready
    assert got["u"] == ("cancelled", "enough", 7.0)  # unknown
    assert s.records["u"].attempt_log == [(1, 1.0, 3.0, "interrupted")]
    assert (s.status, s.error, s.failed_by, s.active) == ("cancelled", "enough", None, 0)
    assert s.outcome() == ("cancelled", "enough")
    s2.apply(ev("run_cancelled", 8.0))  # Run.fail's event says failed; a plain one, without a reason, says so
    assert (s2.status, s2.error) == ("cancelled", "run cancelled")
    s3 = RunState("r", plan, ())
    s3.apply(ev("run_created", 0.0))
    s3.apply(ev("step_started", 1.0, "a", attempt=1))
    s3.apply(ev("run_cancelled", 2.0, reason="a decision", status="failed"))
    assert (s3.status, s3.error, s3.failed_by, s3.records["a"].attempt_log) == (
        "failed", "a decision", "a decision", [(1, 1.0, 2.0, "cancelled")])
    assert s3.outcome() == ("failed", "a decision")


def test_model_calls_add_up_tokens_and_cost_and_keep_their_step() -> None:
    s = state()
    s.apply(ev("model_call", 1.0, None, prompt_tokens=3, completion_tokens=4, cost_usd=0.5))
    s.apply(Event("r1", "model_call", 2.0, "a", {"prompt_tokens": 1, "at": 1.5}))
    s.apply(ev("model_call", 3.0, None, completion_tokens=2, cost_usd=0.25))
    assert (s.tokens, s.cost_usd) == (10, 0.75)
    assert s.model_calls == [
        {"prompt_tokens": 3, "completion_tokens": 4, "cost_usd": 0.5, "at": 1.0},
        {"prompt_tokens": 1, "at": 1.5, "step": "a"},
        {"completion_tokens": 2, "cost_usd": 0.25, "at": 3.0}]
