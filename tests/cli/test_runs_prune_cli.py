"""``planweave runs`` pages and filters from run summaries; ``planweave prune`` removes ended runs only."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import Result

from planweave import run_virtual
from planweave.bench.scale import fill_journal
from planweave.journal import open_journal

from .test_cli import invoke, sqlite_url

RUNS = 40  # fill_journal: run i is failed if i % 20 == 7, left running by a gone process if i % 20 == 13


def _filled(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path)
    run_virtual(fill_journal(url, RUNS, 3))
    return url


def _ids(result: Result) -> list[str]:
    return [row["run_id"] for row in json.loads(result.stdout)]


def test_runs_pages_newest_first_and_prints_the_next_cursor(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    first = invoke("runs", "--journal", url, "--limit", "5", "--json")
    assert first.exit_code == 0, first.output
    assert _ids(first) == [f"fill-{i:06d}" for i in range(39, 34, -1)]
    hint = first.stderr.strip()
    assert hint.startswith("more runs: planweave runs --limit 5 --cursor ")
    second = invoke("runs", "--journal", url, *hint.split()[4:], "--json")
    assert _ids(second) == [f"fill-{i:06d}" for i in range(34, 29, -1)]
    everything = invoke("runs", "--journal", url, "--json")
    assert len(_ids(everything)) == RUNS and everything.stderr == ""


def test_runs_filters_by_status_and_start(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    failed = json.loads(invoke("runs", "--journal", url, "--status", "failed", "--json").stdout)
    interrupted = invoke("runs", "--journal", url, "--status", "interrupted,failed", "--json")
    recent = invoke("runs", "--journal", url, "--since", "30.5m", "--json")
    table = invoke("runs", "--journal", url, "--status", "failed")
    assert [(r["run_id"], r["status"], r["steps"]) for r in failed] == [
        ("fill-000027", "failed", {"failed": 1, "skipped": 2}), ("fill-000007", "failed", {"failed": 1, "skipped": 2})]
    assert _ids(interrupted) == ["fill-000033", "fill-000027", "fill-000013", "fill-000007"]
    assert len(_ids(recent)) == 30
    assert table.exit_code == 0 and "fill-000027" in table.stdout and "fill-000026" not in table.stdout


def test_runs_refuses_an_unknown_status_or_start(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    status = invoke("runs", "--journal", url, "--status", "done")
    since = invoke("runs", "--journal", url, "--since", "yesterday-ish")
    assert status.exit_code == 2 and "unknown run status 'done'" in status.stderr
    assert since.exit_code == 2 and "--since" in since.stderr and "Traceback" not in since.output


def test_prune_removes_old_ended_runs_only_and_says_what_it_freed(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    young = invoke("prune", "--journal", url, "--older-than", "1")  # every run ended within the last hour
    assert young.exit_code == 0 and young.stdout.startswith("pruned 0 runs")
    done = invoke("prune", "--journal", url, "--older-than", "0", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert len(report["runs"]) == RUNS - 4 and report["bytes_freed"] > 0 and report["outputs"] > 0
    left = _ids(invoke("runs", "--journal", url, "--json"))
    assert left == ["fill-000033", "fill-000027", "fill-000013", "fill-000007"]  # failed and interrupted stay
    failed = invoke("prune", "--journal", url, "--older-than", "0", "--status", "failed")
    assert failed.exit_code == 0 and failed.stdout.startswith("pruned 2 runs") and "smaller" in failed.stdout
    assert _ids(invoke("runs", "--journal", url, "--json")) == ["fill-000033", "fill-000013"]

    async def events_left() -> int:
        async with open_journal(url) as journal:
            return len(await journal.read(None))

    assert run_virtual(events_left()) > 0  # the interrupted runs' events are all still there
    refused = invoke("prune", "--journal", url, "--older-than", "0", "--status", "running")
    assert refused.exit_code == 2 and "prune removes ended runs only" in refused.stderr
