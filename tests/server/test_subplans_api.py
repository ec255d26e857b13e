"""``GET /runs/{id}/subplans``: a run's child runs (nested) and a child's parent, as ``planweave show`` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from planweave import run_virtual
from planweave.cli.inspect_cmd import read_tree
from tests.planning.subplan_world import world
from tests.planning.test_subplans import run_tree

from .conftest import start_live


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SUBPLAN_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("SUBPLAN_GATE", raising=False)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result, _ = run_virtual(run_tree(url, world()))
    assert result.ok, result.error
    return url


async def test_the_server_lists_a_runs_sub_plans_as_show_does(tree: str) -> None:
    async with start_live(tree, recover=False) as live, live.client() as client:
        root = await client.get("/runs/root/subplans")
        mid = await client.get("/runs/root.mid/subplans")
        missing = await client.get("/runs/nope/subplans")
    assert root.status_code == 200, root.text
    body = root.json()
    assert body["parent"] is None
    assert [(c["run"], c["status"], c["answer"]) for c in body["children"]] == [("root.mid", "succeeded",
                                                                                  "mid answer")]
    assert [c["run"] for c in body["children"][0]["children"]] == ["root.mid.leaf"]
    assert mid.json()["parent"] == {"run": "root", "step": "mid", "depth": 1}
    assert missing.status_code == 404
    _, shown = await read_tree(tree, "root")  # the CLI's read: the same tree
    assert shown == body["children"]


async def test_the_dashboard_lists_a_runs_sub_plans_with_links(tree: str, tmp_path: Path) -> None:
    from .browser import browser_page, log_in, require_browser

    require_browser()
    from playwright.async_api import expect

    errors: list[str] = []
    async with start_live(tree, recover=False) as live, browser_page(tmp_path / "profile", errors) as page:
        await log_in(page, live.url, live.token)
        await page.goto(f"{live.url}#/runs/root")
        box = page.locator("#run-subplans")
        await expect(box).to_be_visible()
        await expect(box.locator("summary")).to_have_text("sub-plans (1)")
        await expect(box.locator('a[href="#/runs/root.mid"]')).to_be_visible()
        await expect(box.locator('a[href="#/runs/root.mid.leaf"]')).to_be_visible()  # nested under root.mid
        await expect(box.locator(".subplan-answer").first).to_have_text(" mid answer")
        await box.locator("summary").click()  # collapse
        await expect(box.locator('a[href="#/runs/root.mid"]')).to_be_hidden()
        await box.locator("summary").click()  # expand again
        await box.locator('a[href="#/runs/root.mid"]').click()
        await expect(page.locator("#run-title")).to_have_text("root.mid")
        await expect(page.locator("#run-subplans .subplan-parent a")).to_have_text("root")
    assert not errors, errors
