"""The first reply to a waiting step is final, in every journal: ``append_reply`` records a ``step_reply`` only when
none stands for the step, the check and the write in one transaction, so of several writers racing (each on its
own connection) exactly one is recorded and the others are told which one stands."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from planweave import Event, open_journal
from planweave.core.replies import standing_reply
from planweave.journal import Journal
from planweave.journal.base import ReplyWritten, append_reply

from .conftest import Backend

WRITERS = 6


def reply(value: int, by: str) -> Event:
    return Event("r1", "step_reply", 1000.0 + value, "ask", {"value": value, "by": by})


async def waiting(journal: Journal) -> None:
    journal.append(Event("r1", "run_created", 1.0, None, {"plan": {"steps": []}}))
    journal.append(Event("r1", "input_requested", 2.0, "ask", {"prompt": "?", "schema": None}))
    await journal.flush()


@asynccontextmanager
async def journals(url: str, n: int) -> AsyncIterator[list[Journal]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_journal(url)) for _ in range(n)]


async def test_the_first_reply_is_recorded_and_a_later_one_is_told_which_stands(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        await waiting(journal)
        first = await append_reply(journal, reply(1, "alice"))
        second = await append_reply(journal, reply(2, "bob"))
        events = await journal.read("r1")
    assert first.recorded and first.event.pos == events[-1].pos and first.event.data["by"] == "alice"
    assert second == ReplyWritten(False, first.event)
    assert [e.data.get("value") for e in events if e.kind == "step_reply"] == [1]


async def test_a_decision_the_run_applied_stands_and_a_new_request_opens_a_new_wait(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        await waiting(journal)
        journal.append(Event("r1", "input_given", 3.0, "ask", {"value": 0}))  # in-process, buffered: counts too
        refused = await append_reply(journal, reply(1, "alice"))
        journal.append(Event("r1", "input_requested", 4.0, "ask", {"prompt": "again?", "schema": None}))
        again = await append_reply(journal, reply(2, "bob"))
    assert not refused.recorded and refused.event.kind == "input_given" and refused.event.data == {"value": 0}
    assert again.recorded and again.event.data["value"] == 2


async def test_of_writers_racing_on_their_own_connections_exactly_one_is_recorded(durable: Backend) -> None:
    async with journals(durable.url, WRITERS) as opened:
        await waiting(opened[0])
        results = await asyncio.gather(*(append_reply(j, reply(i, f"writer {i}")) for i, j in enumerate(opened)))
        stored = [e for e in await opened[0].read("r1") if e.kind == "step_reply"]
    recorded = [r for r in results if r.recorded]
    assert len(recorded) == 1 and len(stored) == 1, results
    assert all(r.event == stored[0] for r in results)  # the losers were told which one stands
    assert standing_reply(stored) == stored[0]
