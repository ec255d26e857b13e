"""``planweave serve --queue``: POST /runs records the plan for the workers and returns at once; a worker runs it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from planweave import open_engine
from planweave.journal.leases import LeaseStore
from planweave.server import LiveServer, create_app
from planweave.tools import builtin_tools
from tests.workers import worker_tools
from tests.workers.conftest import Schema
from tests.workers.procs import start_worker, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TOKEN = "queue-test-token-0123456789"


@contextlib.asynccontextmanager
async def queue_server(url: str, *, queue: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """A server on the journal at ``url`` (``--queue`` unless told not); a client of it, at ``client.base_url``."""
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(
            open_engine(url, tools=builtin_tools().merged(worker_tools.toolbox)))
        store = await LeaseStore.open(url)
        stack.push_async_callback(store.close)
        app = create_app(engine, TOKEN, recover=False, queue=store if queue else None)
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        yield await stack.enter_async_context(httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30))


async def test_post_runs_queues_the_plan_and_a_worker_runs_it(pg_schema: Schema, tmp_path: Path) -> None:
    async with queue_server(pg_schema.url) as client:
        plan = {"steps": [{"id": "a", "tool": "pause", "args": {"seconds": 0.01, "value": 7}}]}
        posted = await client.post("/runs", json={"plan": plan, "run_id": "via-http"})
        assert posted.status_code == 201, posted.text
        assert posted.json() == {"run_id": "via-http", "status": "queued"}
        assert posted.headers["location"] == "/queue/via-http"
        assert pg_schema.query("SELECT count(*) FROM {s}.planweave_events") == [(0,)]  # nothing ran here
        assert (await client.get("/queue/via-http")).json()["state"] == "queued"
        assert (await client.get("/workers")).json() == {"runs": {"queued": 1}, "workers": []}

        goal = await client.post("/runs", json={"goal": "plan something"})
        assert goal.status_code == 422 and "queues plans" in goal.text
        bad = await client.post("/runs", json={"plan": {"steps": [{"id": "x", "tool": "nope"}]}})
        assert bad.status_code == 422 and "nope" in bad.text
        assert (await client.get("/queue/nope")).status_code == 404
        resumed = await client.post("/runs/via-http/resume")
        assert resumed.status_code == 409 and "workers' queue" in resumed.text, resumed.text

        worker = start_worker(pg_schema.url, "w1", tmp_path, "--lease", "2")
        try:
            await asyncio.to_thread(wait_until, "the worker finishing the run", lambda: pg_schema.query(
                "SELECT outcome FROM {s}.planweave_leases WHERE run_id = 'via-http'") == [("succeeded",)], 20)
            listing = (await client.get("/workers")).json()
            assert [w["name"] for w in listing["workers"]] == ["w1"]
            assert listing["runs"] == {"done/succeeded": 1}
        finally:
            assert worker.stop() == 0
        run = await client.get("/runs/via-http")
        assert run.status_code == 200 and run.json()["status"] == "succeeded", run.text


async def test_without_queue_there_are_no_workers_to_list(pg_schema: Schema) -> None:
    async with queue_server(pg_schema.url, queue=False) as client:
        response = await client.get("/workers")
        assert response.status_code == 404 and "--queue" in response.text
