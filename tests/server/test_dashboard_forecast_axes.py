"""The dashboard's forecast in a real browser (Debian's chromium, headless): the histogram of simulated makespans has
a time axis, a runs axis and the deadline marked and labelled; a success probability the forecast cannot know (no
history in the journal: null) reads "unknown (no history)", never 0% or 100%."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.conftest import gated_tools, start_live

from .browser import browser_page, require_browser


def no_calls(req: RecordedRequest) -> Reply:
    return Text("unused")  # the plan has no llm step: the model only lets the server take a budget


# By their estimates 15 s, then two steps of 0.5 s: the simulated makespans lie around 16 s, next to the 17 s deadline.
# The first step waits at a gate the test never opens: the page is read while the first forecast (no history yet:
# success unknown) is the run's last.
PLAN = {"steps": [
    {"id": "fetch", "tool": "gate", "estimate": {"duration": 15, "cost": 0.01}},
    {"id": "parse", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["fetch"],
     "estimate": {"duration": 0.5, "cost": 0.01}},
    {"id": "report", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["parse"],
     "estimate": {"duration": 0.5, "cost": 0.01}},
]}
TICK = re.compile(r"^(0|\d+ ms|\d+(\.\d+)? s|\d+ min( \d+ s)?|\d+ h( \d+ min)?)$")


async def test_the_forecast_histogram_has_axes_and_the_deadline_and_unknown_success_says_so(
        journal_url: str, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    gate = asyncio.Event()
    async with start_live(journal_url, tools=gated_tools(gate), model=no_calls) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": PLAN, "run_id": "ax", "deadline": 17, "budget_usd": 1})
        assert created.status_code == 201, created.text
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/ax")
            await expect(page.locator("#forecast")).to_be_visible(timeout=10_000)
            # Success (and success within every limit) is unknown: no run of these tools is in the journal.
            for bar in ("#forecast-success", "#forecast-all"):
                await expect(page.locator(f"{bar} .value")).to_have_text("unknown (no history)")
                await expect(page.locator(bar)).to_have_class(re.compile(r"\bunknown\b"))
                await expect(page.locator(bar)).not_to_have_class(re.compile(r"\blow\b"))
            await expect(page.locator("#forecast-deadline .value")).to_have_text(re.compile(r"^\d+%$"))
            chart = page.locator("#forecast-hist")
            await expect(chart.locator("rect.bin")).not_to_have_count(0)
            await page.locator("#forecast").screenshot(path=str(tmp_path / "forecast.png"))
            # The x axis: time ticks in the dashboard's units, increasing from left to right.
            ticks = chart.locator("text.x-tick")
            await expect(ticks).not_to_have_count(0)
            labels = await ticks.all_text_contents()
            assert len(labels) >= 3, labels
            assert all(TICK.match(label) for label in labels), labels
            xs = [float(await t.get_attribute("x") or "nan") for t in await ticks.all()]
            assert xs == sorted(xs) and len(set(xs)) == len(xs), xs
            await expect(chart.locator("line.x-axis")).to_have_count(1)
            # The y axis counts simulated runs, from 0.
            await expect(chart.locator("text.y-label")).to_have_text("runs")
            assert (await chart.locator("text.y-tick").all_text_contents())[0] == "0"
            # The deadline: a line inside the chart, labelled with its time.
            await expect(chart.locator("line.deadline")).to_have_count(1)
            await expect(chart.locator("text.deadline-label")).to_have_text("deadline 17.0 s")
            line_x = float(await chart.locator("line.deadline").get_attribute("x1") or "nan")
            assert xs[0] <= line_x <= xs[-1] + 60, (line_x, xs)
        events = await live.journal_events("ax")
    assert errors == []
    first = next(e.data for e in events if e.kind == "forecast")
    assert first["p_success"] is None and first["p_all"] is None  # what the page said "unknown" of


def sse_frame(pos: int, kind: str, at: float, data: dict[str, Any]) -> str:
    event = {"run_id": "spread", "kind": kind, "at": at, "step": None, "data": data, "pos": pos}
    return f"id: {pos}\nevent: {kind}\ndata: {json.dumps(event)}\n\n"


# Simulated makespans spread over 60-100 s in 20 bins; the deadline far beyond them (5 min); success known.
SPREAD = {
    "runs": 200, "p_success": 0.83, "p_deadline": 0.97, "p_budget": None, "p_all": 0.81,
    "makespan": {"p50": 78.0, "p90": 92.0, "p99": 99.0}, "cost_usd": {"p50": 0, "p90": 0, "p99": 0},
    "critical_steps": ["fetch"], "deadline": 300.0, "budget_usd": None, "elapsed": 0.0, "untimed": [],
    "histogram": [[60.0 + 2 * i, c] for i, c in enumerate(
        [1, 2, 4, 7, 10, 14, 18, 21, 23, 22, 20, 17, 13, 10, 7, 5, 3, 2, 1, 1])],
}


async def test_a_spread_of_makespans_gets_minute_ticks_and_a_far_deadline_an_arrow_to_it(
        journal_url: str, tmp_path: Path) -> None:
    """The forecast shown is the one the event stream carries (here a given one, on a run that exists)."""
    require_browser()
    from playwright.async_api import Route, expect

    gate = asyncio.Event()
    async with start_live(journal_url, tools=gated_tools(gate)) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": {"steps": [{"id": "fetch", "tool": "gate"}]},
                                                   "run_id": "spread"})
        assert created.status_code == 201, created.text
        stream = sse_frame(1, "run_created", 1000.0, {}) + sse_frame(2, "forecast", 1000.0, SPREAD)

        async def given_events(route: Route) -> None:
            await route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=stream)

        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.route("**/runs/spread/events", given_events)
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/spread")
            chart = page.locator("#forecast-hist")
            await expect(chart.locator("rect.bin")).to_have_count(20, timeout=10_000)
            await page.locator("#forecast").screenshot(path=str(tmp_path / "forecast.png"))
            await expect(page.locator("#forecast-success .value")).to_have_text("83%")
            await expect(page.locator("#forecast-all .value")).to_have_text("81%")
            await expect(page.locator("#forecast-budget")).to_be_hidden()
            labels = await chart.locator("text.x-tick").all_text_contents()
            assert len(labels) >= 3 and all(TICK.match(label) for label in labels), labels
            assert "1 min 20 s" in labels, labels
            await expect(chart.locator("line.deadline")).to_have_count(0)  # off the chart: an arrow says where
            await expect(chart.locator("text.deadline-label")).to_have_text("deadline 5 min 0 s →")
            heights = [float(await b.get_attribute("height") or "nan") for b in await chart.locator("rect.bin").all()]
            assert max(heights) == heights[8], heights  # the tallest bin is the one with most runs
        gate.set()
    assert errors == []
