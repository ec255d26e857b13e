"""A real browser for the dashboard tests: Debian's chromium, headless, driven by Playwright.

Tests call :func:`require_browser` first (a skip without chromium or Playwright, a failure under ``CI=true``), then
open the dashboard in :func:`browser_page`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Page

CHROMIUM = os.environ.get("PLANWEAVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_browser() -> None:
    """Skip the test unless Playwright and chromium are there; under CI (``CI=true``) their absence fails it."""
    problem = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        problem = "the playwright Python package is not installed"
    if problem is None and not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        problem = f"chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the dashboard test must run in CI, but {problem}")
        pytest.skip(problem)


@asynccontextmanager
async def browser_page(profile: Path, errors: list[str]) -> AsyncIterator[Page]:
    """A page of a fresh headless chromium (its profile in ``profile``, a 1400x900 viewport) until the block ends;
    every uncaught script error of the page is appended to ``errors``, for the test to assert after."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 900})
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
        finally:
            await context.close()


async def log_in(page: Page, url: str, token: str, shown: str = "#main") -> None:
    """Open the dashboard at ``url``, log in with ``token`` and wait until the element ``shown`` is visible."""
    from playwright.async_api import expect

    await page.goto(url)
    await page.fill("#token-input", token)
    await page.click("#login-button")
    await expect(page.locator(shown)).to_be_visible()


# The plan graph is drawn on a canvas by Cytoscape.js: its nodes are not elements of the page. The tests read them
# through the dashboard's handle (window.planweave.view.cy) with Cytoscape selectors ('node.critical',
# 'node[status = "running"]', 'edge.critical', '#step-id'), and click them where they are drawn, with the mouse.
_MATCHING = "(sel) => { const v = window.planweave && window.planweave.view; " \
            "return v && v.cy ? v.cy.elements(sel).map((e) => e.id()) : []; }"


async def drawn(page: Page, selector: str) -> set[str]:
    """The ids of the drawn nodes or edges (``e:FROM>TO``) that match the Cytoscape ``selector``."""
    return set(await page.evaluate(_MATCHING, selector))


async def until_drawn(page: Page, selector: str, count: int | None = None, timeout: float = 10_000) -> None:
    """Wait until ``count`` drawn elements match ``selector`` (None: at least one)."""
    await page.wait_for_function(
        "([sel, n]) => { const v = window.planweave && window.planweave.view; if (!v || !v.cy) return false; "
        "const k = v.cy.elements(sel).length; return n === null ? k > 0 : k === n; }", arg=[selector, count],
        timeout=timeout)


async def click_node(page: Page, node_id: str) -> None:
    """Click the drawn node ``node_id`` with the mouse (it is first brought into view, as a person would pan to it)."""
    box = await page.evaluate(
        "(id) => { const cy = window.planweave.view.cy; const n = cy.getElementById(id); "
        "if (n.empty()) return null; const e = cy.extent(); const p = n.position(); "
        "if (p.x < e.x1 || p.x > e.x2 || p.y < e.y1 || p.y > e.y2) cy.center(n); "
        "const r = n.renderedPosition(); const c = cy.container().getBoundingClientRect(); "
        "return {x: c.left + r.x, y: c.top + r.y}; }", node_id)
    assert box is not None, f"no node {node_id!r} is drawn"
    await page.mouse.click(box["x"], box["y"])


async def in_view(page: Page, node_id: str) -> bool:
    """Whether the drawn node ``node_id`` is inside the graph's visible area."""
    return bool(await page.evaluate(
        "(id) => { const cy = window.planweave.view.cy; const n = cy.getElementById(id); if (n.empty()) return false; "
        "const r = n.renderedPosition(); return r.x >= 0 && r.y >= 0 && r.x <= cy.width() && r.y <= cy.height(); }",
        node_id))
