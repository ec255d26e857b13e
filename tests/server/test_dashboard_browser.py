"""The dashboard in a real browser (Debian's chromium, headless): log in, start a run, watch it finish.

Skipped when chromium or Playwright is missing, except under CI (``CI=true``), where that is a failure.
``PLANWEAVE_UPDATE_SCREENSHOTS=1`` rewrites ``docs/dashboard.png`` from the run it watches.
"""

from __future__ import annotations

import os
from pathlib import Path

from .browser import browser_page, click_node, drawn, log_in, require_browser, until_drawn
from .conftest import Live

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
PLAN_YAML = """\
name: dashboard demo
steps:
  - id: fetch
    tool: sleep
    args: {seconds: 0.3}
    estimate: {duration: 0.3}
  - id: parse
    tool: sleep
    args: {seconds: 0.3}
    after: [fetch]
    estimate: {duration: 0.3}
  - id: index
    tool: sleep
    args: {seconds: 0.3}
    after: [fetch]
    estimate: {duration: 0.1}
  - id: report
    tool: noop
    args: {parsed: "${parse}", indexed: "${index}"}
"""


async def test_the_dashboard_shows_a_run_progress_to_completion(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    errors: list[str] = []
    refused: list[str] = []  # every answer of 400 or more the page got: none on load (favicon, /workers)
    async with browser_page(tmp_path / "profile", errors) as page:
        page.on("response", lambda r: refused.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        # Log in once: the token is kept in localStorage.
        await log_in(page, live.url, live.token)
        # This server has no model: the form starts plans only (no goal choice), and has no queue (no workers).
        await expect(page.locator("#submit-kind")).to_be_hidden()
        await expect(page.locator("#workers")).to_be_hidden()

        # Start a run from the dashboard and follow it live.
        await page.click("#new-run summary")
        await page.fill("#plan-input", PLAN_YAML)
        await page.click("#submit-button")
        await expect(page.locator("#run")).to_be_visible()
        run_id = (await page.locator("#run-title").inner_text()).strip()
        await expect(page.locator(f'tr[data-run="{run_id}"]')).to_be_visible()

        await until_drawn(page, "node", 4)
        # It is seen running before it ends (live updates, not a reload).
        await until_drawn(page, 'node[status = "running"]')
        await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=20_000)
        await until_drawn(page, 'node[status = "succeeded"]', 4)
        await until_drawn(page, "node.critical", 3)  # fetch, parse or index (both sleep 0.3 s), report
        await until_drawn(page, "edge.critical", 2)
        await expect(page.locator("#gantt rect.bar")).to_have_count(4)
        await expect(page.locator("#gantt rect.bar.outcome-succeeded")).to_have_count(4)
        await expect(page.locator(f'tr[data-run="{run_id}"] .badge')).to_have_text("succeeded")
        await expect(page.locator("#version-select option")).to_have_count(1)

        # The token survives a reload (no second prompt).
        await page.reload()
        await expect(page.locator("#run-status")).to_have_text("succeeded")
        await expect(page.locator("#login")).to_be_hidden()

        shot = await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        assert shot.startswith(b"\x89PNG")
        # docs/dashboard.png is committed: rewrite it only when asked, so test runs leave the tree clean.
        if os.environ.get("PLANWEAVE_UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists():
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            SCREENSHOT.write_bytes(shot)
    assert errors == []
    assert refused == []
    result = await live.wait(run_id)
    assert result.ok


async def test_a_wrong_token_is_asked_for_again(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    async with browser_page(tmp_path / "profile", []) as page:
        await page.goto(live.url)
        await page.fill("#token-input", "not-the-token-at-all")
        await page.click("#login-button")
        await expect(page.locator("#login-error")).to_have_text("The token was not accepted.")
        await expect(page.locator("#login")).to_be_visible()


STEP_PLAN = {"steps": [
    {"id": "fetch", "tool": "sleep", "args": {"seconds": 0.05, "result": {"rows": [1, 2, 3], "city": "oslo"}}},
    {"id": "count", "tool": "noop", "args": {"n": "${fetch.rows[2]}", "where": "${fetch.city}"}},
    {"id": "later", "tool": "sleep", "args": {"seconds": 30}, "after": ["count"]},
]}


async def test_clicking_a_step_shows_its_inputs_output_and_attempts(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    async with live.client() as client:
        created = await client.post("/runs", json={"plan": STEP_PLAN, "run_id": "panel"})
        assert created.status_code == 201, created.text
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/panel")
            await until_drawn(page, 'node#later[status = "running"]', 1)

            await click_node(page, "count")
            await expect(page.locator("#step-panel")).to_be_visible()
            await expect(page.locator("#step-title")).to_have_text("count")
            await expect(page.locator("#step-status")).to_have_text("succeeded")
            await expect(page.locator("#step-output")).to_have_text('{\n  "n": 3,\n  "where": "oslo"\n}')
            await expect(page.locator("#step-args")).to_have_text('{\n  "n": 3,\n  "where": "oslo"\n}')
            await expect(page.locator("#step-attempts tbody tr")).to_have_count(1)
            assert await drawn(page, "node:selected") == {"count"}

            # The output is collapsible.
            await page.click("#step-output-box summary")
            await expect(page.locator("#step-output")).to_be_hidden()

            # A running step has no output yet; it shows once the step is cancelled with the run.
            await click_node(page, "later")
            await expect(page.locator("#step-title")).to_have_text("later")
            await expect(page.locator("#step-output")).to_have_text("(none: the step is running)")
            await page.click("#cancel-run")
            await expect(page.locator("#step-status")).to_have_text("cancelled", timeout=10_000)
        assert errors == []


HUMAN_PLAN = {"steps": [
    {"id": "build", "tool": "noop", "args": {"artifact": "app-1.2"}},
    {"id": "deploy", "tool": "noop", "args": {"what": "${build.artifact}"}, "after": ["build"],
     "approval": "Deploy app-1.2 to production?"},
    {"id": "replicas", "tool": "human.input",
     "args": {"prompt": "How many replicas?", "schema": {"type": "integer", "minimum": 1}}},
    {"id": "scale", "tool": "noop", "args": {"n": "${replicas}", "deployed": "${deploy.what}"}},
]}


async def test_a_person_approves_a_step_and_gives_a_value_in_the_dashboard(live: Live, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    async with live.client() as client:
        created = await client.post("/runs", json={"plan": HUMAN_PLAN, "run_id": "human"})
        assert created.status_code == 201, created.text
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/human")

            approval = page.locator('.waiting-item[data-step="deploy"]')
            value = page.locator('.waiting-item[data-step="replicas"]')
            await expect(approval.locator(".prompt")).to_have_text("Deploy app-1.2 to production?",
                                                                   timeout=10_000)
            await expect(value.locator(".prompt")).to_have_text("How many replicas?")
            await expect(value.locator(".schema")).to_contain_text('"minimum":1')
            await until_drawn(page, 'node#deploy[status = "waiting_approval"]', 1)
            await expect(page.locator('tr[data-run="human"] .waiting-badge')).to_have_text("2 waiting")

            # A value the schema refuses is explained, and the step keeps waiting.
            await value.locator("textarea").fill("0")
            await value.locator("button.send").click()
            await expect(value.locator(".error-text")).to_contain_text("0 is less than the minimum of 1")
            await value.locator("textarea").fill("3")
            await value.locator("button.send").click()
            await expect(value).to_have_count(0, timeout=10_000)

            await approval.locator("input.reason").fill("release window")
            await approval.locator("button.approve").click()
            await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=10_000)
            await expect(page.locator("#waiting")).to_be_hidden()
        assert errors == []
    result = await live.wait("human")
    assert result.outputs["scale"] == {"n": 3, "deployed": "app-1.2"}
