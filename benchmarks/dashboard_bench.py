"""The dashboard at 100, 1,000 and 10,000 steps, measured in a real browser (Playwright + Debian's chromium).

For each size a layered plan (ten steps a layer, each after two of the layer before, one side step that fails) is run
by an in-process ``planweave`` server on 127.0.0.1 and opened in headless chromium twice:

- finished: the run has ended before the page opens (its events are replayed to the page);
- live: the page opens as the run starts and watches it stream (``sleep`` steps) for ``--watch`` seconds, following
  its frontier.

Interactive means: every step of the plan is known to the page and drawn (as itself, or in the collapsed group
that stands for it: plans above 500 steps open collapsed by layer), and the run's status is shown.

Printed per size and mode: the time from navigation (a page load of the run's address) to interactive, the
page's height, the main thread's long tasks (PerformanceObserver ``longtask``: how many, the longest) while the run
streams, and the time to find and open the failed step by search (type ``status:failed``, Enter, until its panel
shows it; its collapsed group is expanded on the way). Targets (issue 32): interactive under 2 s at 10,000 steps,
no long task above 200 ms while streaming, a page height that does not grow with the plan.

    .venv/bin/python benchmarks/dashboard_bench.py [--sizes 100,1000,10000] [--watch 6] [--screenshots docs/images]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer

from planweave import open_engine
from planweave.bench.cli import parse_command_line
from planweave.server import LiveServer, create_app

if TYPE_CHECKING:
    from playwright.async_api import Page

TOKEN = "dashboard-benchmark-token-0123456789abcdef"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTH = 10  # steps a layer

# Collects the page's long tasks from its first script on (buffered: those before the observer too).
LONG_TASKS = """
window.__longtasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longtasks.push(e.duration); })
  .observe({ type: "longtask", buffered: true });
"""


def layered_plan(n: int, *, seconds: float | None = None, approval: bool = False) -> dict[str, Any]:
    """``n`` steps in layers of ten (``L{layer}-{j}``), each after two of the layer before; a side step ``bad`` fails
    (a reference to an output field that does not exist); with ``approval`` a side step ``gate`` waits for a person.
    ``seconds``: ``sleep`` steps of that long (a run that streams for a while), else instant ``noop`` steps."""
    steps: list[dict[str, Any]] = []
    layers = max(1, n // WIDTH)
    for layer in range(layers):
        for j in range(WIDTH):
            step: dict[str, Any] = {"id": f"L{layer}-{j}", "tool": "sleep" if seconds else "noop",
                                    "args": {"seconds": seconds} if seconds else {"j": j}}
            if layer:
                step["after"] = [f"L{layer - 1}-{j}", f"L{layer - 1}-{(j + 1) % WIDTH}"]
            steps.append(step)
    steps.append({"id": "bad", "tool": "noop", "args": {"x": "${L0-0.missing}"}, "after": ["L0-0"]})
    if approval:
        steps.append({"id": "gate", "tool": "noop", "args": {}, "after": ["L0-1"], "approval": "Ship it?"})
    return {"name": f"layered {n}", "on_failure": "continue", "steps": steps}


@dataclass
class Figures:
    """One size in one mode."""

    steps: int
    mode: str  # finished or live
    interactive_s: float  # navigation to every node drawn and the status shown
    page_height_px: int
    long_tasks: int  # while the run streamed, once the page was interactive (live); from its load on (finished)
    longest_task_ms: float
    search_open_s: float  # status:failed typed: from its Enter until the failed step's panel shows it
    events_seen: int


@contextlib.asynccontextmanager
async def serving(journal_url: str) -> AsyncIterator[str]:
    async with open_engine(journal_url) as engine:
        app = create_app(engine, TOKEN)
        async with LiveServer(app, "127.0.0.1", 0, log_config=None, access_log=False) as server:
            yield server.url


async def start_run(client: httpx.AsyncClient, plan: dict[str, Any], run_id: str) -> None:
    created = await client.post("/runs", json={"plan": plan, "run_id": run_id})
    created.raise_for_status()


async def wait_finished(client: httpx.AsyncClient, run_id: str, cap: float = 600.0) -> None:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        body = (await client.get(f"/runs/{run_id}", params={"outputs": "false"})).json()
        if body["status"] != "running":
            return
        await asyncio.sleep(0.25)  # a benchmark's wait for a server-side run: polling is fine here
    raise TimeoutError(f"run {run_id} did not finish in {cap} s")


async def measure_page(page: Page, url: str, run_id: str, steps: int, *, live: bool, watch: float,
                       shots: Path | None) -> Figures:
    """Open the run's page and measure it (see the module's docstring); ``shots``: write its pictures there, the
    overview (``dashboard-STEPS-MODE.png``) and, for a finished run, the failed step found by search
    (``dashboard-STEPS-search.png``)."""
    await page.goto(f"{url}#token={TOKEN}")  # the token is kept in localStorage
    await page.wait_for_selector("#main:not([hidden])")
    # A real navigation to the run's page: its time origin is the navigation's start, so performance.now() when
    # the page is interactive counts the HTML, the scripts (Cytoscape's 436 kB), the login check and the run.
    await page.goto("about:blank")
    await page.goto(f"{url}#/runs/{run_id}")
    # The predicate returns the time it first held: read later, it would count this process's own delays (the server
    # under measure shares its event loop with this client).
    ready = await page.wait_for_function(
        "(n) => { const v = window.planweave && window.planweave.view; return v && v.cy && v.graph && v.plan"
        " && v.plan.steps.length >= n && v.cy.nodes().length === v.graph.nodes.size && v.summary"
        " && document.getElementById('run-status').textContent ? performance.now() : false; }", arg=steps,
        polling="raf", timeout=60_000)
    interactive = float(await ready.json_value()) / 1000
    load_tasks: list[float] = await page.evaluate("window.__longtasks.splice(0)")
    if live:  # from here on: while the run streams, the graph following its running steps
        await page.check("#follow")
        await asyncio.sleep(watch)
    else:
        await asyncio.sleep(1.0)  # the replayed events settle
    tasks: list[float] = await page.evaluate("window.__longtasks.slice()")
    if not live:
        tasks += load_tasks
    height = int(await page.evaluate("document.documentElement.scrollHeight"))
    mode = "live" if live else "finished"
    if shots is not None:
        await page.screenshot(path=str(shots / f"dashboard-{steps // 10 * 10}-{mode}.png"))
    await page.wait_for_function("() => window.planweave.view.status.get('bad') === 'failed'", timeout=60_000)
    # Timed in the page, from the Enter that ends the query to the panel showing the failed step (the typing's pace
    # is the typist's; the matches are listed as it goes).
    await page.evaluate("() => document.getElementById('dag-search').addEventListener('keydown', "
                        "(e) => { if (e.key === 'Enter') window.__typedAt = performance.now(); }, true)")
    await page.click("#dag-search")
    await page.keyboard.type("status:failed")
    await page.keyboard.press("Enter")
    opened = await page.wait_for_function(
        "() => !document.getElementById('step-panel').hidden && "
        "document.getElementById('step-status').textContent === 'failed' ? performance.now() : false", polling="raf")
    search = (float(await opened.json_value()) - float(await page.evaluate("window.__typedAt"))) / 1000
    if shots is not None and not live:
        await page.screenshot(path=str(shots / f"dashboard-{steps // 10 * 10}-search.png"))
    events = int(await page.evaluate("window.planweave.view.stream ? window.planweave.view.stream.lastId : 0"))
    return Figures(steps, mode, round(interactive, 3), height, len(tasks),
                   round(max(tasks, default=0.0), 1), round(search, 3), events)


async def bench(sizes: list[int], watch: float, screenshots: Path | None) -> list[Figures]:
    from playwright.async_api import async_playwright

    results: list[Figures] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with serving(f"sqlite:///{Path(tmp) / 'runs.db'}") as url, \
                httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client, \
                async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                for n in sizes:
                    for live in (False, True):
                        run_id = f"{'live' if live else 'done'}-{n}"
                        plan = layered_plan(n, seconds=0.02 if live else None)
                        await start_run(client, plan, run_id)
                        if not live:
                            await wait_finished(client, run_id)
                        context = await browser.new_context(viewport={"width": 1400, "height": 900})
                        await context.add_init_script(LONG_TASKS)
                        page = await context.new_page()
                        try:
                            figures = await measure_page(page, url, run_id, len(plan["steps"]), live=live,
                                                         watch=watch, shots=screenshots)
                            results.append(figures)
                            print(json.dumps(asdict(figures)), flush=True)
                        finally:
                            await context.close()
                        if live:
                            await client.post(f"/runs/{run_id}/cancel", json={})
            finally:
                await browser.close()
    return results


def table(results: list[Figures]) -> str:
    head = "| steps | run | interactive | page height | long tasks (longest) | search → panel |"
    rows = [head, "|---:|---|---:|---:|---:|---:|"]
    for f in results:
        rows.append(f"| {f.steps:,} | {f.mode} | {f.interactive_s:.2f} s | {f.page_height_px:,} px | "
                    f"{f.long_tasks} ({f.longest_task_ms:.0f} ms) | {f.search_open_s:.2f} s |")
    return "\n".join(rows)


def main(
    sizes: Annotated[str, typer.Option(help="Plan sizes, comma-separated.")] = "100,1000,10000",
    watch: Annotated[float, typer.Option(help="Seconds a live run is watched streaming.")] = 6.0,
    screenshots: Annotated[Path | None, typer.Option(help="Write a screenshot per size and mode here.")] = None,
) -> None:
    """The dashboard's load time, page height, long tasks and search at growing plan sizes (see the docstring)."""
    try:
        wanted = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--sizes {sizes!r}: give whole numbers, e.g. 100,1000,10000") from None
    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(bench(wanted, watch, screenshots))
    print(table(results))


if __name__ == "__main__":
    parse_command_line(main, None, "dashboard_bench.py")
