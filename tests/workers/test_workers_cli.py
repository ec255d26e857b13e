"""``planweave submit``, ``worker`` and ``workers`` end to end: bad input refused with exit 2, and the listing."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workers.conftest import Schema
from tests.workers.procs import TOOLS, start_worker, wait_until
from tests.workers.test_control import cli

pytestmark = [pytest.mark.postgres]


def plan_file(tmp: Path, gate: Path) -> Path:
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump({"steps": [{"id": "hold", "tool": "wait_for", "args": {"gate": str(gate)}}]}))
    return path


def test_submit_refuses_a_journal_workers_cannot_share_and_a_plan_its_tools_cannot_run(
        pg_schema: Schema, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, tmp_path / "gate")
    local = cli("submit", str(plan), "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--tools", TOOLS)
    assert local.returncode == 2 and "needs a postgresql:// journal" in local.stderr, local
    assert "Traceback" not in local.stderr
    unknown = cli("submit", str(plan), "--journal", pg_schema.url, "--json")  # wait_for is not a built-in
    assert unknown.returncode == 2, unknown
    assert json.loads(unknown.stdout)["status"] == "invalid"
    assert "wait_for" in unknown.stderr
    listing = cli("workers", "--journal", pg_schema.url, "--json")
    assert listing.returncode == 0, listing
    assert json.loads(listing.stdout)["runs"] == {}  # nothing was queued


@pytest.mark.slow
def test_workers_lists_each_worker_with_its_runs_and_lease_ages(pg_schema: Schema, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    queued = cli("submit", str(plan_file(tmp_path, gate)), "--journal", pg_schema.url, "--tools", TOOLS, "--json",
                 "--run-id", "held")
    assert queued.returncode == 0, queued
    assert json.loads(queued.stdout) == {"status": "queued", "run_id": "held", "journal": pg_schema.url}
    again = cli("submit", str(plan_file(tmp_path, gate)), "--journal", pg_schema.url, "--tools", TOOLS,
                "--run-id", "held")
    assert again.returncode == 2 and "already queued" in again.stderr, again

    w = start_worker(pg_schema.url, "w1", tmp_path, "--lease", "3")
    try:
        def listing() -> dict[str, object]:
            shown = cli("workers", "--journal", pg_schema.url, "--json")
            assert shown.returncode == 0, shown
            result: dict[str, object] = json.loads(shown.stdout)
            return result

        wait_until("w1 holding the run", lambda: listing()["runs"] == {"running": 1}, timeout=20)
        workers: list[dict[str, Any]] = listing()["workers"]  # type: ignore[assignment]
        [worker] = workers
        assert (worker["name"], worker["alive"], worker["lease_s"]) == ("w1", True, 3.0)
        [run] = worker["runs"]
        assert (run["run_id"], run["epoch"], run["holder"]) == ("held", 1, "w1")
        assert 0 < run["expires_in_s"] <= 3 and run["held_s"] >= 0
        human = cli("workers", "--journal", pg_schema.url)
        assert "w1  alive" in human.stdout and "held  epoch 1" in human.stdout, human

        twin = cli("worker", "--journal", pg_schema.url, "--name", "w1", "--tools", TOOLS)
        assert twin.returncode == 2 and "already running" in twin.stderr, twin
        by_hand = cli("resume", "held", "--journal", pg_schema.url, "--tools", TOOLS)
        assert by_hand.returncode == 2 and "worker w1 holds it" in by_hand.stderr, by_hand
        assert "Traceback" not in by_hand.stderr

        w.signal(signal.SIGTERM)  # a clean stop hands the run back to the queue at once
        assert w.stop() == 0
        assert "handed run held back to the queue" in w.text()
        after = listing()
        assert after["runs"] == {"queued": 1} and after["workers"] == []
        stopped = json.loads(cli("workers", "--journal", pg_schema.url, "--json", "--all").stdout)
        assert [(x["name"], x["stopped"]) for x in stopped["workers"]] == [("w1", True)]
    finally:
        gate.touch()
        w.stop()


def test_cancel_takes_a_run_nobody_claimed_off_the_queue(pg_schema: Schema, tmp_path: Path) -> None:
    queued = cli("submit", str(plan_file(tmp_path, tmp_path / "gate")), "--journal", pg_schema.url, "--tools", TOOLS,
                 "--run-id", "unwanted")
    assert queued.returncode == 0, queued
    cancelled = cli("cancel", "unwanted", "--journal", pg_schema.url)
    assert cancelled.returncode == 0 and "was still queued" in cancelled.stdout, cancelled
    assert pg_schema.query("SELECT state, outcome FROM {s}.planweave_leases") == [("done", "cancelled")]
    again = cli("cancel", "unwanted", "--journal", pg_schema.url)
    assert again.returncode == 2 and "already ended: cancelled" in again.stderr, again
    unknown = cli("cancel", "never-was", "--journal", pg_schema.url)
    assert unknown.returncode == 2 and "no run 'never-was'" in unknown.stderr, unknown
