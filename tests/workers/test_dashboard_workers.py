"""The dashboard of a ``serve --queue`` server shows which worker runs which run, in a real browser."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.workers.conftest import Schema
from tests.workers.procs import held_by, start_worker, wait_until
from tests.workers.test_server_queue import TOKEN, queue_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHROMIUM = os.environ.get("PLANWEAVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _require_browser() -> None:
    """Skip without Playwright or chromium, as the server's dashboard tests do (a failure under CI=true)."""
    try:
        import playwright.async_api  # noqa: F401
        problem = None if os.path.exists(CHROMIUM) or shutil.which(CHROMIUM) else f"no chromium at {CHROMIUM}"
    except ImportError:
        problem = "the playwright Python package is not installed"
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the dashboard test must run in CI, but {problem}")
        pytest.skip(problem)


async def test_the_workers_panel_links_each_worker_to_the_runs_it_holds(pg_schema: Schema, tmp_path: Path) -> None:
    _require_browser()
    from playwright.async_api import async_playwright, expect

    gate = tmp_path / "gate"
    async with queue_server(pg_schema.url) as client:
        plan = {"steps": [{"id": "hold", "tool": "wait_for", "args": {"gate": str(gate)}}]}
        assert (await client.post("/runs", json={"plan": plan, "run_id": "held"})).status_code == 201
        worker = start_worker(pg_schema.url, "w1", tmp_path, "--lease", "3")
        try:
            await asyncio.to_thread(wait_until, "w1 holding the run", lambda: held_by(pg_schema, "w1") == 1)
            async with async_playwright() as pw:
                context = await pw.chromium.launch_persistent_context(
                    str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = context.pages[0] if context.pages else await context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    await page.goto(str(client.base_url))
                    await page.fill("#token-input", TOKEN)
                    await page.click("#login-button")
                    await expect(page.locator("#workers")).to_be_visible()
                    await expect(page.locator("#workers .worker-name")).to_have_text("w1")
                    await expect(page.locator('#workers a[href="#/runs/held"]')).to_be_visible()
                    await expect(page.locator("#workers-queue")).to_have_text("queue: running 1")
                    gate.touch()
                    await expect(page.locator("#workers-queue")).to_have_text("queue: done/succeeded 1",
                                                                              timeout=15_000)
                    await expect(page.locator('#workers a[href="#/runs/held"]')).to_have_count(0)
                    assert errors == []
                finally:
                    await context.close()
        finally:
            gate.touch()
            assert worker.stop() == 0
