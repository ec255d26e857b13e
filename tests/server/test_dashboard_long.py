"""The dashboard with 1,000 and 10,000-step runs, in a real browser (Debian's chromium, headless).

A layered plan (ten steps a layer, each after two of the layer before) with a side step that fails and one that waits
for an approval: the page opens it collapsed by layer; a search finds a step deep inside and opens its panel beside
its node, both in view; a group expands and the graph collapses again; the approval is given from its collapsed
group; the failed step is one click away at the top. Then a run streams while the graph follows its running steps,
and a goal is started from the form (its budget refused for a model without a price, its deadline taken).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.server.conftest import start_live

from .browser import browser_page, click_node, drawn, in_view, require_browser, until_drawn

pytestmark = pytest.mark.slow
WIDTH = 10


def layered_plan(n: int, *, seconds: float | None = None) -> dict[str, Any]:
    """``n`` steps ``L{layer}-{j}``, ten a layer, each after two of the layer before; side steps ``bad`` (fails: its
    reference names an output field that does not exist) and ``gate`` (waits for an approval)."""
    steps: list[dict[str, Any]] = []
    for layer in range(n // WIDTH):
        for j in range(WIDTH):
            step: dict[str, Any] = {"id": f"L{layer}-{j}", "tool": "sleep" if seconds else "noop",
                                    "args": {"seconds": seconds} if seconds else {"j": j}}
            if layer:
                step["after"] = [f"L{layer - 1}-{j}", f"L{layer - 1}-{(j + 1) % WIDTH}"]
            steps.append(step)
    steps.append({"id": "bad", "tool": "noop", "args": {"x": "${L0-0.missing}"}, "after": ["L0-0"]})
    steps.append({"id": "gate", "tool": "noop", "args": {}, "after": ["L0-1"], "approval": "Ship it?"})
    return {"name": f"layered {n}", "on_failure": "continue", "steps": steps}


# The drawn nodes of the running steps (a step, or the group it is in), when one of them is in view and none of them
# was running before (the ids given): else false, and playwright asks again.
FRONTIER_IN_VIEW = """(before) => {
  const v = window.planweave.view;
  if (!v || !v.cy || !v.graph) return false;
  const ids = [...new Set([...v.status].filter(([, s]) => s === 'running').map(([id]) => v.graph.rep.get(id)))];
  if (!ids.length || ids.some((id) => before.includes(id))) return false;
  const cy = v.cy;
  const shown = ids.some((id) => { const r = cy.getElementById(id).renderedPosition();
    return r.x >= 0 && r.y >= 0 && r.x <= cy.width() && r.y <= cy.height(); });
  return shown ? ids : false;
}"""


def script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "planned from the dashboard"}))
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}},
                            {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}}]))


@pytest.mark.parametrize("n", [1000, 10_000])
async def test_a_long_run_is_found_collapsed_approved_and_followed_in_the_dashboard(
        n: int, journal_url: str, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    deep = f"L{(n // WIDTH) * 2 // 3}-7"  # two thirds of the way down the plan
    last = f"L{n // WIDTH - 1}-9"
    errors: list[str] = []
    async with start_live(journal_url, model=script) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": layered_plan(n), "run_id": "long"})
        assert created.status_code == 201, created.text
        await live.until_step("long", "gate", "waiting_approval")
        await live.until_step("long", last, "succeeded")
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/long")

            # Opened collapsed by layer: a few groups, not n nodes; the page is as tall as for a small plan.
            await until_drawn(page, "node.group", timeout=30_000)
            await expect(page.locator("#collapse-mode")).to_have_value("layer")
            assert len(await drawn(page, "node")) <= 130
            assert await page.evaluate("document.documentElement.scrollHeight") < 2500

            # Search finds a step deep inside a collapsed group and opens its panel beside its node, both in view.
            await page.fill("#dag-search", deep)
            await page.press("#dag-search", "Enter")
            await expect(page.locator("#step-title")).to_have_text(deep)
            await expect(page.locator("#step-status")).to_have_text("succeeded", timeout=10_000)
            await expect(page.locator("#step-panel")).to_be_in_viewport()
            assert await drawn(page, "node:selected") == {deep}
            assert await in_view(page, deep)
            await expect(page.locator(f'#step-list .list-row[data-step="{deep}"]')).to_have_count(1)
            # The step list and the timeline hold the rows in view only, whatever the plan's size.
            await page.fill("#dag-search", "")
            await page.locator("#step-list").evaluate("(box) => { box.scrollTop = box.scrollHeight / 2; }")
            await expect(page.locator("#step-list .list-row").first).to_be_visible()
            assert await page.locator("#step-list .list-row").count() < 40
            assert await page.locator("#gantt rect.bar").count() < 60

            # Collapse and expand: a group opens into its steps; collapsing again draws the groups only.
            await page.fill("#dag-search", "")
            await page.select_option("#collapse-mode", "layer")
            groups = await drawn(page, "node.group")
            group = await page.evaluate("window.planweave.view.graph.rep.get('L5-0')")
            assert group in groups
            await click_node(page, group)
            await expect(page.locator("#step-group")).to_be_visible()
            await page.click("#step-group button.expand-group")
            await until_drawn(page, "#L5-0", 1)
            assert group not in await drawn(page, "node.group")
            await page.select_option("#collapse-mode", "version")
            await until_drawn(page, "node", 1)  # one plan version: one group
            await page.select_option("#collapse-mode", "layer")
            await until_drawn(page, "#L5-0", 0)

            # The failed step is listed at the top, one click from its node.
            await page.click('#attention .chip[data-step="bad"]')
            await expect(page.locator("#step-title")).to_have_text("bad")
            await expect(page.locator("#step-status")).to_have_text("failed")
            assert await drawn(page, "node:selected") == {"bad"}

            # Approve from the collapsed group that holds the waiting step.
            await page.select_option("#collapse-mode", "layer")
            holder = await page.evaluate("window.planweave.view.graph.rep.get('gate')")
            assert holder.startswith("group:")
            await click_node(page, holder)
            item = page.locator('#step-group .waiting-item[data-step="gate"]')
            await expect(item.locator(".prompt")).to_have_text("Ship it?")
            await item.locator("button.approve").click()
            await expect(page.locator("#run-status")).to_have_text("failed", timeout=30_000)  # bad failed
            await live.until_step("long", "gate", "succeeded")

            # Follow the frontier while a run streams: its running steps stay in view as it moves on.
            streaming = await client.post("/runs", json={"plan": layered_plan(n, seconds=0.2), "run_id": "stream"})
            assert streaming.status_code == 201, streaming.text
            await page.goto(f"{live.url}#/runs/stream")
            await until_drawn(page, "node.group", timeout=30_000)
            # Looking at the end of the plan, far from where the run is, then asking to follow.
            await page.evaluate("() => { const cy = window.planweave.view.cy; "
                                "cy.center(cy.nodes().max((n) => n.position('x')).ele); }")
            await page.check("#follow")
            # Some running step drawn in view; later (other steps running) again in view, the view having moved.
            first = await page.wait_for_function(FRONTIER_IN_VIEW, arg=[], timeout=10_000)
            before = await first.json_value()
            # Incremental: what is drawn is the same Cytoscape elements, their statuses changed in place.
            await page.evaluate("() => { window.__drawn = window.planweave.view.cy.nodes()[0]; }")
            moved = await page.wait_for_function(FRONTIER_IN_VIEW, arg=before, timeout=10_000)
            assert set(await moved.json_value()).isdisjoint(before)
            assert await page.evaluate("() => window.planweave.view.cy.nodes()[0] === window.__drawn "
                                       "&& !window.__drawn.removed()")
            await client.post("/runs/stream/cancel", json={})

            # Start a goal from the form: a budget is refused for a model without a price, a deadline is taken.
            await page.click("#new-run summary")
            await page.check('#submit-kind input[value="goal"]')
            await page.fill("#goal-input", "do a then b")
            await page.fill("#budget-input", "1")
            await page.click("#submit-button")
            await expect(page.locator("#submit-error")).to_contain_text("price")
            await page.fill("#budget-input", "")
            await page.fill("#deadline-input", "120")
            await page.click("#submit-button")
            await expect(page.locator("#run-plan")).to_have_text("do a then b", timeout=10_000)
            await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=30_000)
            await expect(page.locator("#gantt text.model-label").first).to_be_visible()
            await expect(page.locator("#run-models")).to_contain_text("cost unknown")
    assert errors == []

