"""The dashboard's memory page in a real browser (Debian's chromium, headless): the entries with their use counts,
a status filter, and provenance links that open the page of the run an entry came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from planweave import extras
from planweave.memory import Candidate, open_memory_store

from .browser import browser_page, log_in, require_browser
from .conftest import Live, chain_plan


async def test_the_memory_page_lists_entries_and_links_their_runs(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    origin = await live.engine.start(chain_plan(2, 0.0), run_id="learned-here")
    await origin.wait()
    await live.engine.journal.flush()
    async with open_memory_store(live.journal_url) as store:
        skill = await store.add(Candidate(
            "skill", "city-weather", "report a city's weather",
            ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},), {"city": "oslo"},
            run_id="learned-here", step_ids=("s0", "s1")))
        lesson = await store.add(Candidate("lesson", "slow-forecast", "the forecast tool is slow"))
        await store.set_status(skill.id, "admitted", "replay succeeded")
        await store.record_use([skill.id])
        await store.record_use([skill.id])
        await store.record_use([skill.id])

    errors: list[str] = []
    async with browser_page(tmp_path / "profile", errors) as page:
        await log_in(page, live.url, live.token)

        await page.click("#memory-link")
        await expect(page.locator("#memory")).to_be_visible()
        rows = page.locator("#memory-entries tbody tr")
        await expect(rows).to_have_count(2)
        row = page.locator(f'#memory-entries tr[data-entry="{skill.id}"]')
        await expect(row.locator(".uses")).to_have_text("3")
        await expect(row.locator(".badge")).to_have_text("admitted")
        await expect(row.locator(".steps")).to_have_text("s0, s1")
        await expect(page.locator(f'#memory-entries tr[data-entry="{lesson.id}"] .provenance')).to_have_text("—")

        await page.select_option("#memory-status", "candidate")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-entry", str(lesson.id))
        await page.select_option("#memory-status", "")
        await expect(rows).to_have_count(2)

        # A use recorded later shows on Refresh.
        async with open_memory_store(live.journal_url) as store:
            await store.record_use([skill.id])
        await page.click("#memory-refresh")
        await expect(row.locator(".uses")).to_have_text("4")

        # The provenance link opens the run's page; back returns to the memory page.
        await row.locator(".provenance a").click()
        await expect(page.locator("#run")).to_be_visible()
        await expect(page.locator("#memory")).to_be_hidden()
        await expect(page.locator("#run-title")).to_have_text("learned-here")
        await expect(page.locator("#run-status")).to_have_text("succeeded")
        await page.go_back()
        await expect(page.locator("#memory")).to_be_visible()
        await expect(page.locator("#run")).to_be_hidden()
        await expect(rows).to_have_count(2)
    assert errors == []


async def test_without_the_memory_extra_the_page_says_which_extra(live: Live, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    require_browser()
    from playwright.async_api import expect

    monkeypatch.setitem(extras.EXTRAS, "memory", ("planweave_no_such_module_h9",))
    errors: list[str] = []
    async with browser_page(tmp_path / "profile", errors) as page:
        await log_in(page, live.url + "#/memory", live.token, shown="#memory")
        await expect(page.locator("#memory-error")).to_be_visible()
        await expect(page.locator("#memory-error")).to_contain_text(
            "GET /memory needs the 'memory' extra: pip install 'planweave[memory]'")
        await expect(page.locator("#memory-entries tbody tr")).to_have_count(0)
        await expect(page.locator("#login")).to_be_hidden()  # a 501 is not a token problem
    assert errors == []
