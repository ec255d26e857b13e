"""Which reply stands for a step's wait (engine/replies.py, pure): the first one, and a later reply never changes it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planweave import Event
from planweave.core.replies import describe_reply, standing_reply

KINDS = ("approval_requested", "input_requested", "step_reply", "approval_given", "input_given")


def ev(kind: str, pos: int, **data: object) -> Event:
    return Event("r1", kind, 1_700_000_000.0 + pos, "deploy", dict(data), pos)


def test_the_first_journaled_reply_stands_until_the_run_applies_a_decision() -> None:
    asked, first, second = ev("approval_requested", 1), ev("step_reply", 2, approve=False), ev("step_reply", 3)
    applied = ev("approval_given", 4, approve=False, reply=2)
    assert standing_reply([]) is None and standing_reply([asked]) is None
    assert standing_reply([asked, first, second]) == first
    assert standing_reply([asked, first, applied, second]) == applied


def test_a_decision_taken_in_process_first_stands_over_a_reply_journaled_before_it() -> None:
    asked, journaled, in_process = ev("approval_requested", 1), ev("step_reply", 2), ev("approval_given", 3)
    assert standing_reply([asked, journaled, in_process]) == in_process


def test_a_new_request_opens_a_new_wait_but_keeps_a_reply_not_applied_yet() -> None:
    value = ev("input_given", 2, value=3)
    assert standing_reply([ev("input_requested", 1), value, ev("input_requested", 3)]) is None  # a retry asks again
    pending = ev("step_reply", 2, value=3)
    assert standing_reply([ev("input_requested", 1), pending, ev("input_requested", 3)]) == pending  # resumed


def test_a_reply_is_described_with_who_when_and_what() -> None:
    rejected = ev("approval_given", 0, approve=False, reason="freeze week", by="alice@ci-3")
    assert describe_reply(rejected) == "rejected ('freeze week') by alice@ci-3 at 2023-11-14T22:13:20Z"
    assert describe_reply(ev("step_reply", 0, value={"n": 3})) == (
        'the value {"n": 3} by an unnamed caller at 2023-11-14T22:13:20Z (journaled, not applied yet)')


@given(st.lists(st.sampled_from(KINDS), max_size=12))
def test_a_later_reply_never_changes_the_one_that_stands(kinds: list[str]) -> None:
    events = [ev(kind, i) for i, kind in enumerate(kinds)]
    before = standing_reply(events)
    after = standing_reply([*events, ev("step_reply", len(events))])
    if before is not None:
        assert after == before
    else:
        assert after is not None and after.pos == len(events)  # nothing stood: the new reply does
