"""The first reply to a waiting step is final, whichever way it comes: in-process (``Run.approve``/``Run.send``) or
journaled by another process (``send_approval``/``send_input``). The later one is refused naming the one that stands,
also when the two race, and a resume applies the first journaled reply, never a later one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, Event, ReplyRefused, open_engine, open_journal, run_virtual, send_approval
from planweave.core.clock import VirtualClock
from planweave.journal.memory import MemoryJournal
from tests.timing import step_is, until

GATED = {"steps": [
    {"id": "deploy", "tool": "noop", "args": {"what": "v1"}, "approval": "Deploy v1?"},
    {"id": "after", "tool": "human.input", "args": {"prompt": "Done?"}, "after": ["deploy"]},
]}


def kinds_of(events: list[Event], step: str) -> list[str]:
    return [e.kind for e in events if e.step == step]


async def test_a_journaled_reply_after_an_in_process_one_is_refused_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    async with open_engine(url) as engine, open_journal(url) as other:
        run = await engine.start(GATED, run_id="r1")
        await until(run, step_is("deploy", "waiting_approval"), "the approval request")
        await engine.journal.flush()
        await run.approve("deploy", reason="ship it", by="ops@desk")  # journaled durably before it returns
        with pytest.raises(ReplyRefused, match=r"first reply is final: approved \('ship it'\) by ops@desk") as refused:
            await send_approval(other, "r1", "deploy", approve=False, reason="freeze", by="alice@laptop")
        await until(run, step_is("after", "waiting_input"), "the step after the approved one")
        run.cancel("done")
        events = await engine.journal.read("r1")
    assert refused.value.decision["approve"] is True and refused.value.decision["by"] == "ops@desk"
    # The rejection may be journaled before the approval (it landed while the approval was buffered): the run's
    # process took the approval first, so the rejection was refused, never applied.
    decided = [k for k in kinds_of(events, "deploy") if k != "step_reply"]
    assert decided[:3] == ["approval_requested", "approval_given", "step_started"]
    assert [e.data["approve"] for e in events if e.kind == "approval_given"] == [True]


async def test_an_in_process_reply_after_a_journaled_one_is_refused_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    async with open_engine(url) as engine, open_journal(url) as other:
        run = await engine.start(GATED, run_id="r1")
        await until(run, step_is("deploy", "waiting_approval"), "the approval request")
        await engine.journal.flush()
        how = await send_approval(other, "r1", "deploy", approve=False, reason="freeze", by="alice@laptop")
        with pytest.raises(ReplyRefused, match=r"rejected \('freeze'\) by alice@laptop"):
            await run.approve("deploy", by="ops@desk")
        result = await asyncio.wait_for(run.wait(), 10)
    assert how == "applied"  # the owner applied it before send_approval returned
    assert result.state.records["deploy"].error_kind == "rejected" and result.state.records["deploy"].attempts == 0


async def test_an_in_process_reply_racing_a_journaled_one_exactly_one_wins_and_the_other_is_told(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    outcomes: list[tuple[bool, bool]] = []  # (the in-process approval won, the journaled rejection won)
    async with open_engine(url) as engine, open_journal(url) as other:
        for i in range(5):
            run = await engine.start(GATED, run_id=f"r{i}")
            await until(run, step_is("deploy", "waiting_approval"), "the approval request")
            await engine.journal.flush()
            sent = asyncio.create_task(send_approval(other, run.id, "deploy", approve=False, by="alice@laptop"))
            await asyncio.sleep(0.05 * i)  # from before the reply is journaled to after the owner applied it
            try:
                await run.approve("deploy", by="ops@desk")
                mine = True
            except ReplyRefused:
                mine = False
            try:
                theirs = await sent == "applied"
            except ReplyRefused:
                theirs = False
            if mine:
                await until(run, step_is("after", "waiting_input"), "the step after the approved one")
                run.cancel("done")
            result = await asyncio.wait_for(run.wait(), 10)
            ran = result.state.records["deploy"].status == "succeeded"
            assert ran == mine, (i, mine, theirs)
            outcomes.append((mine, theirs))
    assert all(mine != theirs for mine, theirs in outcomes), outcomes


def test_a_resume_applies_the_first_journaled_reply_never_a_later_one() -> None:
    """A journal written before replies were checked may hold two: the first stands (here: the rejection)."""
    journal = MemoryJournal()
    ran: list[str] = []

    async def go() -> Any:
        async with Engine(journal, clock=VirtualClock()) as eng:
            run = await eng.start(GATED, run_id="r1")
            await asyncio.sleep(5)
            assert run.state.records["deploy"].status == "waiting_approval"
        for approve, by in ((False, "alice"), (True, "bob")):
            journal.append(Event("r1", "step_reply", 10.0, "deploy", {"approve": approve, "reason": None, "by": by}))
        async with Engine(journal, clock=VirtualClock()) as eng:
            eng.subscribe(lambda e: ran.append(e.step or "") if e.kind == "step_started" else None)
            return await (await eng.resume("r1")).wait()

    result = run_virtual(go())
    assert result.state.records["deploy"].error_kind == "rejected"
    assert "deploy" not in ran
    given = [e for e in run_virtual(journal.read("r1")) if e.kind == "approval_given"]
    assert [(e.data["approve"], e.data["by"]) for e in given] == [(False, "alice")]
