"""The HTTP API against a real uvicorn server: submit, list, inspect, cancel, resume, and survive a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from planweave.server.runs import run_report
from tests.processes import read_until, running

from .conftest import Live, chain_plan, gated_tools, start_live


async def submit(client: httpx.AsyncClient, plan: dict[str, Any], **extra: Any) -> str:
    resp = await client.post("/runs", json={"plan": plan, **extra})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    assert resp.headers["location"] == f"/runs/{run_id}"
    return run_id


async def test_healthz_needs_no_token(live: Live) -> None:
    async with live.client(token=None) as client:
        resp = await client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"


async def test_submitted_run_succeeds_and_reads_like_run_json(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, chain_plan(3, 0.01))
        result = await live.wait(run_id)
        resp = await client.get(f"/runs/{run_id}")
    assert resp.status_code == 200
    body = resp.json()
    assert body == run_report(result.state, outputs=result.outputs)
    assert body["outputs"] == {f"s{i}": {"slept": 0.01} for i in range(3)}
    assert body["status"] == "succeeded"
    assert set(body["steps"]) == {"s0", "s1", "s2"}
    assert all(step["status"] == "succeeded" for step in body["steps"].values())


async def test_a_plan_in_yaml_is_accepted(live: Live) -> None:
    plan_yaml = ("steps:\n  - id: a\n    tool: noop\n    args: {x: 1}\n"
                 "  - id: b\n    tool: noop\n    args: {y: '${a.x}'}\n")
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan_yaml": plan_yaml, "run_id": "from-yaml"})
        assert resp.status_code == 201, resp.text
        result = await live.wait("from-yaml")
    assert result.ok


async def test_an_invalid_plan_is_422_listing_every_problem_by_step_and_field(live: Live) -> None:
    plan = {"steps": [
        {"id": "a", "tool": "slep", "args": {"seconds": 1}},
        {"id": "b", "tool": "noop", "after": ["missing"]},
        {"id": "c", "tool": "noop", "retries": -1},
    ]}
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan": plan})
        listed = await client.get("/runs")
    assert resp.status_code == 422
    problems = {(p["step"], p["field"]) for p in resp.json()["problems"]}
    assert ("c", "retries.max") in problems  # schema problems come first: they stop validation before the graph
    assert "step 'c', retries.max" in resp.json()["detail"]
    assert listed.json() == []  # nothing was journaled

    async with live.client() as client:
        resp = await client.post("/runs", json={"plan": {"steps": plan["steps"][:2]}})
    assert resp.status_code == 422
    found = {(p["step"], p["field"]): p["message"] for p in resp.json()["problems"]}
    assert found[("a", "tool")] == "unknown tool 'slep' (did you mean 'sleep'?)"
    assert found[("b", "after[0]")] == "unknown step 'missing'"


async def test_malformed_yaml_names_the_line(live: Live) -> None:
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan_yaml": "steps:\n  - id: a\n    tool: [noop\n"})
    assert resp.status_code == 422
    [problem] = resp.json()["problems"]
    assert problem["field"] == "plan_yaml"
    assert problem["message"].startswith("line ")


@pytest.mark.parametrize("body", [{}, {"plan": {"steps": []}, "plan_yaml": "steps: []"}, {"plan": [1, 2]},
                                  {"plan": {"steps": []}, "extra": 1}, {"plan": {"steps": []}, "run_id": "a b"}])
async def test_a_malformed_submission_is_422(live: Live, body: dict[str, Any]) -> None:
    async with live.client() as client:
        resp = await client.post("/runs", json=body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["problems"]


async def test_a_taken_run_id_is_409(live: Live) -> None:
    async with live.client() as client:
        await submit(client, chain_plan(1, 0.0), run_id="twice")
        await live.wait("twice")
        resp = await client.post("/runs", json={"plan": chain_plan(1, 0.0), "run_id": "twice"})
    assert resp.status_code == 409
    assert "twice" in resp.json()["detail"]


async def test_runs_are_listed_with_status_times_and_step_counts(live: Live) -> None:
    async with live.client() as client:
        ok = await submit(client, chain_plan(2, 0.0))
        await live.wait(ok)
        bad = await submit(client, {"steps": [{"id": "boom", "tool": "shell", "args": {"argv": ["false"]}},
                                              {"id": "after", "tool": "noop", "after": ["boom"]}]})
        await live.wait(bad)
        resp = await client.get("/runs")
    assert resp.status_code == 200
    rows = {row["run_id"]: row for row in resp.json()}
    assert list(rows) == [bad, ok]  # newest first
    assert rows[ok]["status"] == "succeeded" and rows[ok]["steps"] == {"succeeded": 2}
    assert rows[ok]["makespan_s"] is not None and rows[ok]["started_at"] <= rows[ok]["finished_at"]
    assert rows[bad]["status"] == "failed" and rows[bad]["steps"] == {"failed": 1, "skipped": 1}
    assert "boom" in rows[bad]["error"]
    last = (await live.journal_events())[-1].pos
    assert resp.headers["x-journal-position"] == str(last)


async def test_the_plan_graph_has_dependencies_statuses_and_the_critical_path(live: Live) -> None:
    plan = {"steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0}, "estimate": {"duration": 5}},
        {"id": "b", "tool": "sleep", "args": {"seconds": 0}, "after": ["a"], "estimate": {"duration": 1}},
        {"id": "c", "tool": "sleep", "args": {"seconds": 0}, "after": ["a"], "estimate": {"duration": 9}},
        {"id": "d", "tool": "noop", "after": ["b", "c"]},
    ]}
    async with live.client() as client:
        run_id = await submit(client, plan)
        await live.wait(run_id)
        resp = await client.get(f"/runs/{run_id}/plan")
        missing = await client.get(f"/runs/{run_id}/plan", params={"version": 7})
    body = resp.json()
    assert body["critical_path"] == ["a", "c", "d"]
    assert {s["id"]: s["deps"] for s in body["steps"]} == {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    assert {s["status"] for s in body["steps"]} == {"succeeded"}
    assert [v["version"] for v in body["versions"]] == [1]
    assert missing.status_code == 404


@pytest.mark.parametrize("method,path", [("GET", "/runs/nope"), ("GET", "/runs/nope/plan"),
                                         ("GET", "/runs/nope/events"), ("POST", "/runs/nope/cancel"),
                                         ("POST", "/runs/nope/resume")])
async def test_an_unknown_run_is_404(live: Live, method: str, path: str) -> None:
    async with live.client() as client:
        resp = await client.request(method, path)
    assert resp.status_code == 404
    assert "nope" in resp.json()["detail"]


async def test_cancel_stops_a_running_run(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, {"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 60}}]})
        resp = await client.post(f"/runs/{run_id}/cancel", json={"reason": "enough"})
        assert resp.status_code == 202
        assert resp.json() == {"run_id": run_id, "status": "cancelled"}
        result = await asyncio.wait_for(live.wait(run_id), 10)
        again = await client.post(f"/runs/{run_id}/cancel")
        body = (await client.get(f"/runs/{run_id}")).json()
    assert result.status == "cancelled"
    assert again.status_code == 409
    assert body["status"] == "cancelled" and body["error"] == "enough"


async def test_resume_continues_an_interrupted_run_keeping_finished_steps(journal_url: str) -> None:
    plan = {"steps": [{"id": "first", "tool": "noop", "args": {"n": 1}},
                      {"id": "second", "tool": "gate", "after": ["first"]}]}
    async with start_live(journal_url, tools=gated_tools(asyncio.Event())) as first:
        async with first.client() as client:
            run_id = await submit(client, plan)
        await first.until_step(run_id, "second", "running")  # at the closed gate as the server stops
    gate = asyncio.Event()  # closed until the second resume request is answered: the run is still running then
    async with start_live(journal_url, recover=False, tools=gated_tools(gate)) as second, second.client() as client:
        before = (await client.get(f"/runs/{run_id}")).json()
        resp = await client.post(f"/runs/{run_id}/resume", json={"retry_unknown": False})
        assert resp.status_code == 202, resp.text
        busy = await client.post(f"/runs/{run_id}/resume")
        gate.set()
        result = await second.wait(run_id)
    assert before["status"] == "interrupted"
    assert busy.status_code == 409 and "already running" in busy.json()["detail"]
    assert result.ok
    assert result.state.records["first"].attempts == 1  # not run again


async def test_resume_refuses_a_run_that_already_succeeded(live: Live) -> None:
    async with live.client() as client:
        run_id = await submit(client, chain_plan(1, 0.0))
        await live.wait(run_id)
        resp = await client.post(f"/runs/{run_id}/resume")
    assert resp.status_code == 409
    assert "already ended" in resp.json()["detail"]


async def test_openapi_and_dashboard_are_served(live: Live) -> None:
    async with live.client(token=None) as client:
        schema = await client.get("/openapi.json")
        page = await client.get("/")
        script = await client.get("/static/app.js")
    paths = schema.json()["paths"]
    assert {"/healthz", "/runs", "/runs/{run_id}", "/runs/{run_id}/plan", "/runs/{run_id}/cancel",
            "/runs/{run_id}/resume", "/runs/{run_id}/events", "/events"} <= set(paths)
    assert page.status_code == 200 and "<title>planweave</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert script.status_code == 200 and "openStream" in script.text


async def test_runs_submitted_over_http_are_resumed_after_a_restart(journal_url: str) -> None:
    plan = {"steps": [{"id": "gate", "tool": "gate"}, *chain_plan(2, 0.0)["steps"]]}
    async with start_live(journal_url, tools=gated_tools(asyncio.Event())) as first, first.client() as client:
        run_id = await submit(client, plan)
        await first.until_step(run_id, "gate", "running")
        # Stop the server while the run waits at the gate: the engine interrupts it, leaving it resumable.
    async with start_live(journal_url, tools=gated_tools(None)) as second:
        assert second.server.recovered == [run_id]
        result = await second.wait(run_id)
        async with second.client() as client:
            body = (await client.get(f"/runs/{run_id}")).json()
    assert result.ok
    assert body["status"] == "succeeded"


def _serve(journal_url: str, env: dict[str, str]) -> list[str]:
    code = ("import asyncio; from planweave.server import serve; "
            f"asyncio.run(serve(port=0, journal={journal_url!r}))")
    return [sys.executable, "-c", code]


# Still waiting for its approval when the server is killed, however long the kill takes: no sleep to outlast.
GATED_BY_A_PERSON = {"steps": [{"id": "gate", "tool": "noop", "approval": "go on?"},
                               {"id": "then", "tool": "noop", "args": {"x": 1}, "after": ["gate"]}]}


@pytest.mark.slow
def test_serve_prints_the_token_once_and_resumes_runs_after_being_killed(tmp_path: Path) -> None:
    journal_url = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_TOKEN", "OTEL_"))}
    with running(_serve(journal_url, env), env=env) as proc:  # killed as the block ends: a crash
        lines = read_until(proc, "dashboard: ", at_start=True)
        url = lines[0].split(" serving ")[1].split(" ")[0]
        token = lines[-1].rsplit("#token=", 1)[1]
        token_file = tmp_path / "server-token"
        assert token_file.read_text().strip() == token
        assert token_file.stat().st_mode & 0o777 == 0o600
        headers = {"Authorization": f"Bearer {token}"}
        resp = httpx.post(url + "runs", json={"plan": GATED_BY_A_PERSON}, headers=headers)
        assert resp.status_code == 201
        run_id = resp.json()["run_id"]
    with running(_serve(journal_url, env), env=env) as proc:
        lines = read_until(proc, "resumed interrupted runs: ", at_start=True)
        assert not any(token in line for line in lines)  # shown once only
        assert f"access token: in {token_file}" in lines
        assert lines[-1] == f"resumed interrupted runs: {run_id}"
        url = lines[0].split(" serving ")[1].split(" ")[0]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            approved = client.post(f"/runs/{run_id}/steps/gate/approval", json={"approve": True})
            assert approved.status_code == 200 and approved.json()["outcome"] == "applied", approved.text
            with client.stream("GET", f"/runs/{run_id}/events") as stream:
                kinds = [line.split(": ", 1)[1] for line in stream.iter_lines() if line.startswith("event: ")]
            body = client.get(f"/runs/{run_id}").json()
        assert kinds[-1] == "run_finished" and "run_resumed" in kinds
        assert body["status"] == "succeeded"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
