"""The dashboard shows a run's live forecast in a real browser (Debian's chromium, headless): a probability bar for
its deadline and one for its budget, the makespan percentiles and the histogram of simulated makespans."""

from __future__ import annotations

import re
from pathlib import Path

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.conftest import start_live

from .browser import browser_page, require_browser


def no_calls(req: RecordedRequest) -> Reply:
    return Text("unused")  # the plan has no llm step: the model only lets the server take a budget


# By their estimates: 5 s, then two steps of 0.4 s, $0.3 each: 5.8 s in all (in time for 30 s), $0.9 (over $0.1).
# While the first step runs, the forecast is the plan's own; later ones learn from the history that sleep steps cost
# nothing (what is left still costs $0.15 or more until nothing is), and once nothing is left to run are certain.
PLAN = {"steps": [
    {"id": "fetch", "tool": "sleep", "args": {"seconds": 5}, "estimate": {"duration": 5, "cost": 0.3}},
    {"id": "parse", "tool": "sleep", "args": {"seconds": 0.4}, "after": ["fetch"],
     "estimate": {"duration": 0.4, "cost": 0.3}},
    {"id": "report", "tool": "sleep", "args": {"seconds": 0.4}, "after": ["parse"],
     "estimate": {"duration": 0.4, "cost": 0.3}},
]}


async def test_the_dashboard_shows_the_forecast_of_a_run_with_a_deadline_and_budget(
        journal_url: str, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    async with start_live(journal_url, model=no_calls) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": PLAN, "run_id": "fc", "deadline": 30, "budget_usd": 0.1})
        assert created.status_code == 201, created.text
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/fc")
            await expect(page.locator("#forecast")).to_be_visible(timeout=10_000)
            deadline = page.locator("#forecast-deadline")
            await expect(deadline.locator(".value")).to_have_text("100%")
            await expect(deadline).not_to_have_class("pbar low")
            budget = page.locator("#forecast-budget")
            await expect(budget.locator(".value")).to_have_text("0%")
            await expect(budget).to_have_class("pbar low")
            await expect(page.locator("#forecast-makespan")).to_contain_text(re.compile(r"makespan p50 5\.8\d s"))
            await expect(page.locator("#forecast-makespan")).to_contain_text("critical: fetch → parse → report")
            await expect(page.locator("#forecast-hist rect.bin")).not_to_have_count(0)
            await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=20_000)
            # After the run ends the page still shows its last forecast (replayed from the event stream).
            await page.reload()
            await expect(page.locator("#forecast-deadline .value")).to_have_text("100%", timeout=10_000)
        events = await live.journal_events("fc")
    assert errors == []
    assert [e.data["p_budget"] for e in events if e.kind == "forecast"][:1] == [0.0]
