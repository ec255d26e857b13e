"""The dashboard's critical path in a real browser (Debian's chromium, headless): while a run goes it is the plan's,
by estimates; once the run ended it is the chain that determined the end, as it happened (from the step that
finished last, each step's latest-finishing dependency), in the DAG and the timeline alike."""

from __future__ import annotations

import asyncio
from pathlib import Path

from playwright.async_api import Page

from planweave import Toolbox, builtin_tools
from tests.server.conftest import start_live

from .browser import browser_page, drawn, require_browser, until_drawn

# By the estimates, a (10 s) is the long branch: a -> m -> z. What happens: a is let through at once, b only later,
# so b finishes last of m's dependencies and the run's end was decided by b -> m -> z.
PLAN = {"steps": [
    {"id": "a", "tool": "gate_a", "estimate": {"duration": 10}},
    {"id": "b", "tool": "gate_b", "estimate": {"duration": 0.01}},
    {"id": "side", "tool": "noop", "estimate": {"duration": 0.01}},
    {"id": "m", "tool": "noop", "after": ["a", "b"], "estimate": {"duration": 0.01}},
    {"id": "z", "tool": "noop", "after": ["m"], "estimate": {"duration": 0.01}},
]}


def two_gates(gate_a: asyncio.Event, gate_b: asyncio.Event) -> Toolbox:
    """The built-in tools and two gates the test opens in the order it wants the steps to end."""
    box = builtin_tools()

    async def wait_a() -> dict[str, bool]:
        """Wait until the test opens gate a."""
        await gate_a.wait()
        return {"passed": True}

    async def wait_b() -> dict[str, bool]:
        """Wait until the test opens gate b."""
        await gate_b.wait()
        return {"passed": True}

    box.add(wait_a, name="gate_a", idempotent=True)
    box.add(wait_b, name="gate_b", idempotent=True)
    return box


async def outlined(page: Page, selector: str, attribute: str) -> set[str]:
    return {await node.get_attribute(attribute) or "" for node in await page.locator(selector).all()}


async def test_a_finished_runs_critical_path_follows_what_happened_not_the_estimates(
        journal_url: str, tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    gate_a, gate_b = asyncio.Event(), asyncio.Event()
    async with start_live(journal_url, tools=two_gates(gate_a, gate_b)) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": PLAN, "run_id": "cp"})
        assert created.status_code == 201, created.text
        gate_a.set()
        await live.until_step("cp", "a", "succeeded")
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/cp")
            dag = page.locator("#dag")
            # Running: the plan's critical path, by estimates.
            await until_drawn(page, 'node#a[status = "succeeded"]', 1)
            await expect(dag).to_have_attribute("data-critical", "estimated")
            await expect(page.locator("#critical-key")).to_have_text("critical path (by estimates)")
            assert await drawn(page, "node.critical") == {"a", "m", "z"}

            gate_b.set()
            await live.wait("cp")
            await expect(page.locator("#run-status")).to_have_text("succeeded", timeout=10_000)
            # Ended: the chain that decided the end, b -> m -> z, whatever the estimates said.
            await expect(dag).to_have_attribute("data-critical", "actual")
            await expect(page.locator("#critical-key")).to_have_text("critical path (as run)")
            await until_drawn(page, "node.critical", 3)
            assert await drawn(page, "node.critical") == {"b", "m", "z"}
            assert await drawn(page, "edge.critical") == {"e:b>m", "e:m>z"}
            await expect(page.locator("#gantt rect.bar[data-critical]")).to_have_count(3)
            assert await outlined(page, "#gantt rect.bar[data-critical]", "data-step") == {"b", "m", "z"}
            ticks = await page.locator("#gantt text.tick").all_text_contents()
            assert ticks[0] == "0" and len(ticks) >= 3, ticks  # nice times from the run's start
            await page.screenshot(path=str(tmp_path / "critical.png"), full_page=True)

            # A page opened on the finished run (its events replayed) shows the same.
            await page.reload()
            await expect(page.locator("#dag")).to_have_attribute("data-critical", "actual", timeout=10_000)
            await until_drawn(page, "node.critical", 3)
            assert await drawn(page, "node.critical") == {"b", "m", "z"}
    assert errors == []
