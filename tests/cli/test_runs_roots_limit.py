"""``planweave runs --limit N`` shows N root runs however many sub-plan child runs were started after them."""

from __future__ import annotations

import json
from pathlib import Path

from planweave import open_journal, run_virtual
from planweave.core.events import Event

from .test_cli import invoke, sqlite_url


async def _journal_tree(url: str) -> None:
    """Roots r0, r1, r2, then five children of r2 (newest first: the children come before every root)."""
    async with open_journal(url) as journal:
        for i in range(3):
            journal.append(Event(f"r{i}", "run_created", 100.0 + i, None, {"plan": {"steps": []}, "source": "goal"}))
        for j in range(5):
            link = {"run": "r2", "step": f"c{j}", "depth": 1}
            journal.append(Event(f"r2.c{j}", "run_created", 110.0 + j, None,
                                 {"plan": {"steps": []}, "source": "goal", "options": {"limits": {"parent": link}}}))
        await journal.flush()


def test_runs_limit_shows_that_many_roots_past_more_children_than_the_limit(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    run_virtual(_journal_tree(url))
    page = invoke("runs", "--journal", url, "--json", "--limit", "2")
    assert [r["run_id"] for r in json.loads(page.stdout)] == ["r2", "r1"], page.output
    cursor = page.stderr.split("--cursor ", 1)[1].split()[0]
    rest = invoke("runs", "--journal", url, "--json", "--limit", "2", "--cursor", cursor)
    assert [r["run_id"] for r in json.loads(rest.stdout)] == ["r0"], rest.output
    every = invoke("runs", "--journal", url, "--json", "--all", "--limit", "2")
    assert [r["run_id"] for r in json.loads(every.stdout)] == ["r2.c4", "r2.c3"]
