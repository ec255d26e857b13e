"""Holds across an engine restart: a held run closed while a step waits for a person resumes and ends."""

from __future__ import annotations

import asyncio

import pytest

from planweave import RunResult, VirtualClock, open_engine
from planweave.core.errors import RunError
from tests.engine.conftest import JournalAt, virtual

PLAN = {"steps": [{"id": "a", "tool": "noop"}, {"id": "ask", "tool": "noop", "approval": "ok?", "after": ["a"]}]}


async def start_held_and_close(journal_at: JournalAt) -> None:
    """Start PLAN held open, let 'ask' wait for its approval, then close the engine (the run stays resumable)."""
    async with journal_at.open() as journal, open_engine(journal, clock=VirtualClock()) as engine:
        asked = asyncio.Event()
        await engine.start(PLAN, hold=True, run_id="held",
                           on_event=lambda event: asked.set() if event.kind == "approval_requested" else None)
        await asked.wait()


@pytest.mark.parametrize("hold", [True, False])
def test_a_held_run_closed_while_waiting_resumes_approves_and_ends(journal_at: JournalAt, hold: bool) -> None:
    outcome: list[str] = []

    async def go() -> RunResult:
        await start_held_and_close(journal_at)
        async with journal_at.open() as journal, open_engine(journal, clock=VirtualClock()) as engine:
            run = await engine.resume("held", hold=hold)
            await run.approve("ask")
            try:
                run.release()  # the planner that held it gives its hold back, whether the resume took one or not
            except RunError as exc:
                outcome.append(str(exc))
            async with asyncio.timeout(60):  # virtual seconds: a hang fails here, not at the test timeout
                return await run.wait()

    result = virtual(go)
    assert result.status == "succeeded"
    refused = "run 'held' holds nothing to release (a resumed run holds only with hold=True)"
    assert outcome == ([] if hold else [refused])
