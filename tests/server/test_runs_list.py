"""GET /runs reads run summaries: newest first, filtered by status and start, paged by a cursor."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import Live, chain_plan

FAILING = {"steps": [{"id": "boom", "tool": "shell", "args": {"argv": ["false"]}}]}


async def _submit(live: Live, client: httpx.AsyncClient, plan: dict[str, Any], run_id: str) -> None:
    resp = await client.post("/runs", json={"plan": plan, "run_id": run_id})
    assert resp.status_code == 201, resp.text
    await live.wait(run_id)


async def _pages(client: httpx.AsyncClient, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor is not None else {})}
        resp = await client.get("/runs", params=query)
        assert resp.status_code == 200, resp.text
        pages.append([row["run_id"] for row in resp.json()])
        cursor = resp.headers.get("x-next-cursor")
        if cursor is None:
            return pages


async def test_runs_are_listed_newest_first_filtered_and_paged(live: Live) -> None:
    async with live.client() as client:
        for i in range(5):
            await _submit(live, client, FAILING if i % 2 else chain_plan(1, 0.0), f"run-{i}")
        every = (await client.get("/runs")).json()
        pages = await _pages(client, limit=2)
        failed = await _pages(client, status="failed", limit=1)
        both = await _pages(client, status=["succeeded,failed"], since="1h")
        none_yet = (await client.get("/runs", params={"since": "2999-01-01"})).json()
    assert [row["run_id"] for row in every] == ["run-4", "run-3", "run-2", "run-1", "run-0"]
    assert [row["status"] for row in every] == ["succeeded", "failed", "succeeded", "failed", "succeeded"]
    assert every[0]["steps"] == {"succeeded": 1} and every[1]["steps"] == {"failed": 1}
    assert pages == [["run-4", "run-3"], ["run-2", "run-1"], ["run-0"]]
    assert failed == [["run-3"], ["run-1"]]
    assert both == [["run-4", "run-3", "run-2", "run-1", "run-0"]]
    assert none_yet == []


async def test_a_bad_filter_is_a_422_naming_the_parameter(live: Live) -> None:
    async with live.client() as client:
        status = await client.get("/runs", params={"status": "finished"})
        since = await client.get("/runs", params={"since": "last tuesday"})
        limit = await client.get("/runs", params={"limit": 0})
    assert status.status_code == 422 and status.json()["problems"][0]["field"] == "query.status"
    assert "unknown run status 'finished'" in status.json()["problems"][0]["message"]
    assert since.status_code == 422 and since.json()["problems"][0]["field"] == "query.since"
    assert limit.status_code == 422 and limit.json()["problems"][0]["field"] == "query.limit"
