"""The first reply is final over HTTP too: a later `POST .../approval` or `.../input` is 409 with the reply that stands
in the body (``decision``: who, when, approved or rejected, or the value), also when two are sent at once."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import open_engine
from tests.timing import step_is, until

from .conftest import Live, start_live

GATED = {"steps": [
    {"id": "deploy", "tool": "noop", "args": {"what": "v1"}, "approval": "Deploy v1?"},
    {"id": "ask", "tool": "human.input", "args": {"prompt": "Replicas?", "schema": {"type": "integer"}},
     "after": ["deploy"]},
    {"id": "hold", "tool": "human.input", "args": {"prompt": "Done?"}, "after": ["ask"]},  # keeps the run open
]}


def decision(body: dict[str, Any]) -> dict[str, Any]:
    found = dict(body["decision"])
    assert isinstance(found.pop("at"), float)
    return found


async def test_a_second_reply_to_a_run_running_here_is_409_naming_the_first(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": GATED, "run_id": "h1"})
        await live.until_step("h1", "deploy", "waiting_approval")
        approved = await client.post("/runs/h1/steps/deploy/approval", json={"approve": True, "reason": "ship"})
        rejected = await client.post("/runs/h1/steps/deploy/approval", json={"approve": False, "reason": "stop"})
        await live.until_step("h1", "ask", "waiting_input")
        given = await client.post("/runs/h1/steps/ask/input", json={"value": 3})
        again = await client.post("/runs/h1/steps/ask/input", json={"value": 4})
        await live.until_step("h1", "hold", "waiting_input")
        await client.post("/runs/h1/cancel")
        result = await live.wait("h1")
    assert approved.status_code == 200 and approved.json()["outcome"] == "applied"
    assert rejected.status_code == 409, rejected.text
    by = "the API token's holder at 127.0.0.1"
    assert f"first reply is final: approved ('ship') by {by}" in rejected.json()["detail"]
    assert decision(rejected.json()) == {"by": by, "applied": True, "approve": True, "reason": "ship"}
    assert given.status_code == 200 and again.status_code == 409
    assert decision(again.json()) == {"by": by, "applied": True, "value": 3}
    assert result.outputs["ask"] == 3


async def test_of_two_replies_sent_at_once_to_a_run_another_process_runs_one_is_taken(journal_url: str) -> None:
    async with start_live(journal_url) as live, open_engine(journal_url) as other, live.client() as client:
        run = await other.start(GATED, run_id="elsewhere")
        await until(run, step_is("deploy", "waiting_approval"), "the approval request")
        await other.journal.flush()  # this server knows the other process's run only from the journal
        replies = await asyncio.gather(
            client.post("/runs/elsewhere/steps/deploy/approval", json={"approve": False, "reason": "freeze"}),
            client.post("/runs/elsewhere/steps/deploy/approval", json={"approve": True, "reason": "ship"}))
        await until(run, lambda s: s.records["deploy"].status in ("failed", "succeeded"), "the decision")
        status = run.state.records["deploy"].status
        run.cancel("done")
    taken = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 409]
    assert len(taken) == 1 and len(refused) == 1, [r.text for r in replies]
    assert taken[0].json()["outcome"] == "applied"
    winner = decision(refused[0].json())
    assert status == ("succeeded" if winner["approve"] else "failed")
