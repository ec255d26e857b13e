"""The dashboard's runs list nests child runs (sub-plans) under their parent, folded; a run merely named like a child
stays at the top (in a real browser, Debian's chromium, headless)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from planweave import run_virtual
from tests.planning.subplan_world import world
from tests.planning.test_subplans import run_tree

from .browser import browser_page, click_node, drawn, log_in, require_browser, until_drawn
from .conftest import start_live

if TYPE_CHECKING:
    from playwright.async_api import Page


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A journal with the goal run ``root``, its child ``root.mid`` and grandchild ``root.mid.leaf``."""
    monkeypatch.setenv("SUBPLAN_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("SUBPLAN_GATE", raising=False)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result, _ = run_virtual(run_tree(url, world()))
    assert result.ok, result.error
    return url


async def test_child_runs_are_listed_under_their_parent_not_at_the_top(tree: str, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    errors: list[str] = []
    async with start_live(tree, recover=False) as live, live.client() as client:
        # A root run whose id only looks like a child's.
        created = await client.post("/runs", json={"plan": {"steps": [{"id": "a", "tool": "noop"}]},
                                                   "run_id": "root.lookalike"})
        assert created.status_code == 201, created.text
        await live.wait("root.lookalike")
        async with browser_page(tmp_path / "profile", errors) as page:
            await log_in(page, live.url, live.token)
            rows = page.locator("#runs tbody tr")
            await expect(page.locator('tr[data-run="root"] .fold')).to_have_text("▸1")
            await expect(page.locator('tr[data-run="root.mid"]')).to_have_count(0)  # folded under root
            await expect(page.locator('tr[data-run="root.lookalike"]')).not_to_have_attribute("data-parent", "root")
            await page.click('tr[data-run="root"] .fold')
            await expect(page.locator('tr[data-run="root.mid"]')).to_have_attribute("data-parent", "root")
            await expect(page.locator('tr[data-run="root.mid.leaf"]')).to_have_count(0)
            await page.click('tr[data-run="root.mid"] .fold')
            await expect(page.locator('tr[data-run="root.mid.leaf"]')).to_have_attribute("data-parent", "root.mid")
            # In order: each child right under its parent; the look-alike at the top level.
            order = [await r.get_attribute("data-run") for r in await rows.all()]
            assert order.index("root.mid") == order.index("root") + 1, order
            assert order.index("root.mid.leaf") == order.index("root.mid") + 1, order
            assert await page.locator('tr[data-run="root.lookalike"]').get_attribute("data-parent") is None
    assert errors == []


async def open_node(page: Page, node_id: str, title: str) -> None:
    """Click the drawn node ``node_id`` until the step panel shows ``title`` (boxes appearing above the graph as the
    run's page fills in, such as its sub-plans, move the graph between reading a node's place and the click)."""
    for _ in range(20):
        await click_node(page, node_id)
        if await page.locator("#step-title").text_content() == title:
            return
        await asyncio.sleep(0.25)  # the page settles; then click where the node is now
    raise AssertionError(f"clicking node {node_id!r} did not open its panel ({title!r})")


async def test_a_plan_steps_child_run_expands_inside_the_parents_graph_and_its_steps_open(
    tree: str, tmp_path: Path,
) -> None:
    require_browser()
    from playwright.async_api import expect

    errors: list[str] = []
    async with start_live(tree, recover=False) as live, browser_page(tmp_path / "profile", errors) as page:
        await page.goto(f"{live.url}#token={live.token}")
        await page.goto(f"{live.url}#/runs/root")
        await until_drawn(page, '[id = "mid"]', 1)
        # Collapsed by default: the plan step says it has a sub-plan, none of the child's steps is drawn.
        await page.wait_for_function(
            "() => window.planweave.view.cy.getElementById('mid').data('label').includes('▸ sub-plan')")
        assert await drawn(page, "node.child-step") == set()
        await open_node(page, "mid", "mid")
        await page.click("#step-links .expand-subplan")
        await until_drawn(page, "node.child-step", 2)
        assert await drawn(page, "node.child-step") == {"sub:root.mid/m1", "sub:root.mid/leaf"}
        # Inside the child run's box, after the plan step (an edge from it), in the child's own order.
        assert await page.evaluate(
            "() => { const cy = window.planweave.view.cy; const m1 = cy.getElementById('sub:root.mid/m1'); "
            "return m1.parent().id() + ' ' + cy.getElementById('mid').outgoers('node').map((n) => n.id()).sort()"
            ".join(','); }") == "subplan:root.mid subplan:root.mid,top"
        assert await drawn(page, "edge") >= {"e:sub:root.mid/m1>leaf", "e:mid>subplan:root.mid"}
        assert "▾ sub-plan" in await page.evaluate(
            "() => window.planweave.view.cy.getElementById('mid').data('label')")
        # A child's step opens its panel, read from the child run.
        await open_node(page, "sub:root.mid/m1", "root.mid \u203a m1")
        await expect(page.locator("#step-status")).to_have_text("succeeded")
        await expect(page.locator("#step-args")).to_contain_text('"m1"')
        await expect(page.locator("#step-links a")).to_have_text("root.mid")
        # And the group collapses again from the plan step's panel.
        await open_node(page, "mid", "mid")
        await page.click("#step-links .expand-subplan")
        await until_drawn(page, "node.child-step", 0)
        assert await drawn(page, "node.subplan-group") == set()
    assert errors == []
