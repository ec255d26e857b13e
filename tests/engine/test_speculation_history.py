"""History predictions across runs (docs/speculation.md, "History"): a producer whose tool, version and arguments
match an earlier finished attempt in the same journal (the result-cache index, for any idempotent tool, not only
``cache: true`` ones) predicts its consumer's inputs; the prediction is verified when the producer really finishes.
Adopted speculative outputs are indexed like ordinary outputs. Virtual clock; memory, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from planweave import Engine, Event, RunResult, Toolbox, VirtualClock, builtin_tools, run_virtual
from planweave.engine.cache import cache_key
from planweave.journal.base import find_cached
from tests.engine.conftest import JournalAt

CHAIN = {"steps": [
    {"id": "fetch", "tool": "fetch", "args": {"url": "u"}},
    {"id": "use", "tool": "use", "args": {"page": "${fetch.page}"}},
    {"id": "tail", "tool": "use", "args": {"page": "${use.page}"}},
]}


@dataclass
class Site:
    """An idempotent, not cacheable fetch whose page can change between runs, and a slow consumer (calls counted,
    asserted after the runs)."""

    page: str = "v1"
    calls: Counter[str] = field(default_factory=Counter)

    def toolbox(self) -> Toolbox:
        box = builtin_tools()
        site = self

        async def fetch(url: str) -> dict[str, str]:
            """The page at url."""
            site.calls["fetch"] += 1
            await asyncio.sleep(5)
            return {"page": f"{url}:{site.page}"}

        async def use(page: str) -> dict[str, str]:
            """Work on a page."""
            site.calls[f"use({page})"] += 1
            await asyncio.sleep(3)
            return {"page": f"used {page}"}

        box.add(fetch, idempotent=True)
        box.add(use, idempotent=True)
        return box


def run_in(journal_at: JournalAt, site: Site, run_id: str, speculate: str) -> tuple[RunResult, float]:
    async def once() -> tuple[RunResult, float]:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=site.toolbox()) as eng:
            run = await eng.start(CHAIN, run_id=run_id, speculation=speculate)  # type: ignore[arg-type]
            result = await run.wait()
            return result, float(result.summary["makespan_s"])

    return run_virtual(once())


def kinds(events: list[Event]) -> list[tuple[str, str | None, Any]]:
    return [(e.kind, e.step, dict(e.data.get("basis") or {}) or e.data.get("reason"))
            for e in events if e.kind.startswith("speculation_")]


def test_a_second_run_speculates_from_the_first_runs_outputs_and_keeps_its_results(journal_at: JournalAt) -> None:
    site = Site()
    off, off_time = run_in(journal_at, site, "off", "off")
    first, first_time = run_in(journal_at, site, "first", "safe")  # the journal holds off's outputs: not indexed
    second, second_time = run_in(journal_at, site, "second", "safe")
    assert off.ok and first.ok and second.ok
    assert first.outputs == second.outputs == off.outputs
    assert kinds(journal_at.events("first")) == []  # off's outputs were not indexed (it did not speculate)
    assert kinds(journal_at.events("second")) == [  # safe: one level (tail waits for use's real output)
        ("speculation_started", "use", {"fetch": "history"}), ("speculation_adopted", "use", None)]
    assert off_time == first_time == 11 and second_time == 8  # use ran during fetch's 5 s
    # the adopted attempts' outputs are indexed as the steps' own would be
    succeeded = {e.step: e.data for e in journal_at.events("second") if e.kind == "step_succeeded"}
    assert succeeded["use"]["cache_key"] == cache_key("use", "", {"page": "u:v1"})
    assert "cache_key" not in succeeded["tail"]  # no consumer: nothing would predict from it

    async def indexed() -> Any:
        async with journal_at.open() as journal:
            return await find_cached(journal, succeeded["use"]["cache_key"], -1e18)

    found = run_virtual(indexed())  # first's or second's (each engine's virtual clock starts at 0)
    assert found is not None and found.step == "use" and found.value == {"page": "used u:v1"}


def test_a_history_prediction_that_went_stale_is_discarded_and_the_real_output_wins(journal_at: JournalAt) -> None:
    site = Site()
    first, _ = run_in(journal_at, site, "first", "safe")
    site.page = "v2"  # the page changed between the runs
    second, _ = run_in(journal_at, site, "second", "safe")
    plain, _ = run_in(journal_at, site, "plain", "off")
    assert first.ok and second.ok and plain.ok
    assert second.outputs == plain.outputs
    assert second.outputs["tail"] == {"page": "used used u:v2"}
    assert [k for k in kinds(journal_at.events("second")) if k[0] != "speculation_started"] == [
        ("speculation_discarded", "use", "mismatch: fetch")]
