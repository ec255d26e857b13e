"""The dashboard's timeline folds a draft attempt adopted under another step id onto that step (a real browser).

A goal run drafted by a fast model (planning/draft.py) whose steps are named ``p``, ``r``, ``x`` while the main
planner names them ``paris``, ``rome``, ``pick``: same fingerprints, so every draft attempt is adopted, journaled as
``speculation_adopted`` on the main step with ``draft_step`` the draft's id. The run is made on the virtual clock into
a SQLite journal first (deterministic: the draft always starts first), then a server over that journal shows it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from planweave import VirtualClock, open_engine, run_virtual
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import ScriptedLLM
from tests.planning.test_draft import GOAL, PLAN, Calls, script
from tests.server.conftest import start_live

from .browser import browser_page, require_browser

RENAMED = [{**PLAN[0], "id": "p"}, {**PLAN[1], "id": "r"},
           {**PLAN[2], "id": "x", "args": {"p": "${p.temp}", "r": "${r.temp}"}}]


async def drafted_run(journal_url: str) -> tuple[str, list[dict[str, Any]]]:
    clock = VirtualClock()
    calls = Calls()
    tools = calls.tools(clock)
    server = ScriptedLLM(script(PLAN, RENAMED), models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter, \
            open_engine(journal_url, tools=tools, clock=clock) as engine:
        loop = PlanningLoop(engine, client, tools, options=PlanningOptions(draft=drafter))
        result = await asyncio.wait_for(loop.run(GOAL), 60)
    assert result.ok, result.error
    return result.run_id, list(result.state.speculations)


async def watch(journal_url: str, run_id: str, tmp_path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    from playwright.async_api import expect

    errors: list[str] = []
    async with start_live(journal_url) as live, browser_page(tmp_path / "profile", errors) as page:
        await page.goto(f"{live.url}#token={live.token}")
        await page.goto(f"{live.url}#/runs/{run_id}")
        await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=20_000)
        await expect(page.locator("#gantt rect.bar.speculative")).to_have_count(3, timeout=10_000)
        bars = page.locator("#gantt rect.bar:not(.model-call)")  # the attempts (model calls have rows of their own)
        seen = [(await bars.nth(i).get_attribute("data-step") or "", await bars.nth(i).get_attribute("class") or "")
                for i in range(await bars.count())]
        labels = await page.locator("#gantt text.row-label:not(.model-label)").all_text_contents()
    assert errors == []
    return labels, seen


def test_a_draft_attempt_adopted_under_another_id_is_drawn_on_the_adopting_step(
        journal_url: str, tmp_path: Path) -> None:
    require_browser()
    run_id, speculations = run_virtual(drafted_run(journal_url))
    # The draft's ids are what started; the adoption names the main step.
    assert [(s["step"], s["outcome"]) for s in speculations] == [("p", "adopted"), ("r", "adopted"), ("x", "adopted")]
    labels, bars = asyncio.run(watch(journal_url, run_id, tmp_path))
    assert labels == ["paris", "rome", "pick"]  # no row left open under a draft's id
    assert sorted(bars) == sorted([(s, "bar outcome-succeeded speculative") for s in ("paris", "rome", "pick")])
