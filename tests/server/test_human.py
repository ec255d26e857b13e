"""People in the run over HTTP: `POST /runs/{id}/steps/{step}/approval` and `.../input` (404 / 409 / 422)."""

from __future__ import annotations

import asyncio

from planweave import open_engine
from tests.timing import step_is, until

from .conftest import Live, start_live

APPROVAL_PLAN = {"steps": [
    {"id": "build", "tool": "noop", "args": {"artifact": "app-1.2"}},
    {"id": "deploy", "tool": "noop", "args": {"what": "${build.artifact}"}, "after": ["build"],
     "approval": "Deploy app-1.2 to production?"},
]}
INPUT_PLAN = {"steps": [
    {"id": "ask", "tool": "human.input", "args": {"prompt": "How many replicas?", "schema": {"type": "integer"}}},
    {"id": "scale", "tool": "noop", "args": {"replicas": "${ask}"}},
]}


async def test_an_approval_over_http_lets_the_step_run(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": APPROVAL_PLAN, "run_id": "a1"})
        await live.until_step("a1", "deploy", "waiting_approval")
        waiting = (await client.get("/runs/a1", params={"outputs": False})).json()
        detail = (await client.get("/runs/a1/steps/deploy")).json()
        listed = (await client.get("/runs")).json()
        approved = await client.post("/runs/a1/steps/deploy/approval", json={"approve": True, "reason": "ok"})
        result = await live.wait("a1")
        again = await client.post("/runs/a1/steps/deploy/approval", json={"approve": True})
    assert waiting["steps"]["deploy"]["prompt"] == "Deploy app-1.2 to production?"
    assert detail["status"] == "waiting_approval" and detail["prompt"] == "Deploy app-1.2 to production?"
    assert [run["waiting"] for run in listed] == [{"deploy": "waiting_approval"}]  # as `planweave runs --json`
    assert approved.status_code == 200, approved.text
    assert approved.json() == {"run_id": "a1", "step": "deploy", "outcome": "applied"}
    assert result.status == "succeeded"
    assert result.outputs["deploy"] == {"what": "app-1.2"}
    assert again.status_code == 409 and "already ended" in again.json()["detail"]


async def test_a_rejection_over_http_fails_the_step_with_the_reason(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": APPROVAL_PLAN, "run_id": "a2"})
        await live.until_step("a2", "deploy", "waiting_approval")
        rejected = await client.post("/runs/a2/steps/deploy/approval",
                                     json={"approve": False, "reason": "freeze week"})
        result = await live.wait("a2")
        detail = (await client.get("/runs/a2/steps/deploy")).json()
    assert rejected.status_code == 200, rejected.text
    assert result.status == "failed"
    assert detail["status"] == "failed"
    assert detail["error_kind"] == "rejected" and "freeze week" in detail["error"]


async def test_a_value_over_http_is_checked_against_the_schema_and_becomes_the_output(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": INPUT_PLAN, "run_id": "i1"})
        await live.until_step("i1", "ask", "waiting_input")
        waiting = (await client.get("/runs/i1", params={"outputs": False})).json()
        detail = (await client.get("/runs/i1/steps/ask")).json()
        wrong = await client.post("/runs/i1/steps/ask/input", json={"value": "three"})
        still = (await client.get("/runs/i1/steps/ask")).json()
        missing = await client.post("/runs/i1/steps/ask/input", json={})
        given = await client.post("/runs/i1/steps/ask/input", json={"value": 3})
        result = await live.wait("i1")
    assert waiting["steps"]["ask"]["prompt"] == "How many replicas?"
    assert detail["input_schema"] == {"type": "integer"}
    assert wrong.status_code == 422
    assert wrong.json()["problems"] == [{"step": "ask", "field": "value", "message": wrong.json()["detail"]}]
    assert "'three' is not of type 'integer'" in wrong.json()["detail"]
    assert still["status"] == "waiting_input"
    assert missing.status_code == 422 and missing.json()["problems"][0]["field"] == "body.value"
    assert given.status_code == 200 and given.json()["outcome"] == "applied"
    assert result.status == "succeeded"
    assert result.outputs["ask"] == 3 and result.outputs["scale"] == {"replicas": 3}


async def test_unknown_runs_and_steps_are_404_and_steps_not_waiting_are_409(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": APPROVAL_PLAN, "run_id": "a3"})
        await live.until_step("a3", "deploy", "waiting_approval")
        no_run = await client.post("/runs/nope/steps/deploy/approval", json={"approve": True})
        no_step = await client.post("/runs/a3/steps/deplo/approval", json={"approve": True})
        not_waiting = await client.post("/runs/a3/steps/build/approval", json={"approve": True})
        not_input = await client.post("/runs/a3/steps/deploy/input", json={"value": 1})
        await client.post("/runs/a3/cancel")
    assert no_run.status_code == 404 and "no run 'nope'" in no_run.json()["detail"]
    assert no_step.status_code == 404 and "did you mean 'deploy'?" in no_step.json()["detail"]
    assert not_waiting.status_code == 409
    assert not_waiting.json()["detail"] == "step 'build' of run 'a3' is not waiting for an approval (it is succeeded)"
    assert not_input.status_code == 409 and "not waiting for a value" in not_input.json()["detail"]


async def test_an_approval_reaches_a_run_that_another_process_runs(journal_url: str) -> None:
    async with start_live(journal_url) as live, open_engine(journal_url) as other, live.client() as client:
        run = await other.start(APPROVAL_PLAN, run_id="elsewhere")
        await until(run, step_is("deploy", "waiting_approval"), "the approval request")
        await other.journal.flush()  # this server knows the other process's run only from the journal
        approved = await client.post("/runs/elsewhere/steps/deploy/approval", json={"approve": True})
        result = await asyncio.wait_for(run.wait(), 10)
    assert approved.status_code == 200 and approved.json()["outcome"] == "applied"
    assert result.status == "succeeded"
