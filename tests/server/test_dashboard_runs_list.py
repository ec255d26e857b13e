"""The dashboard's runs list in a real browser: a page of the newest runs, older ones on request, a status filter."""

from __future__ import annotations

from pathlib import Path

from .browser import browser_page, require_browser
from .conftest import Live, chain_plan

FAILING = {"steps": [{"id": "boom", "tool": "shell", "args": {"argv": ["false"]}}]}


async def test_the_runs_list_pages_and_filters(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    first = await live.engine.start(FAILING, run_id="old-bad")
    await first.wait()
    for i in range(51):
        run = await live.engine.start(chain_plan(1, 0.0), run_id=f"ok-{i:02d}")
        await run.wait()
    await live.engine.journal.flush()

    errors: list[str] = []
    async with browser_page(tmp_path / "profile", errors) as page:
        await page.goto(live.url)
        await page.fill("#token-input", live.token)
        await page.click("#login-button")
        rows = page.locator("#runs tbody tr")
        await expect(rows).to_have_count(50)  # one page, newest first
        await expect(rows.first).to_have_attribute("data-run", "ok-50")
        await expect(page.locator("#runs-more")).to_be_visible()
        await page.click("#runs-more")
        await expect(rows).to_have_count(52)
        await expect(rows.last).to_have_attribute("data-run", "old-bad")
        await expect(page.locator("#runs-more")).to_be_hidden()
        await page.select_option("#runs-status", "failed")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run", "old-bad")
    assert errors == []
