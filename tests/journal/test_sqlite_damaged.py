"""A SQLite journal damaged under a live run is said so: the run whose WAL was zeroed while it ran does not report
success, and ``runs``, ``show`` and ``resume`` on the damaged file exit non-0 naming the file and what to do."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planweave.core.errors import JournalError
from planweave.core.events import Event
from planweave.journal.sqlite import SQLiteJournal
from tests.processes import read_until, running

# The gate holds the run open until the test has zeroed the WAL (a file to wait on, not a time).
GATED = ("steps:\n"
         "  - {id: first, tool: noop, args: {x: 1}}\n"
         "  - {id: gate, tool: shell, idempotent: true, after: [first],\n"
         "     args: {argv: [sh, -c, 'while [ ! -f open ]; do sleep 0.05; done']}}\n"
         "  - {id: last, tool: noop, args: {x: 2}, after: [gate]}\n")


def _cli(*args: str, cwd: Path) -> list[str]:
    return [sys.executable, "-m", "planweave.cli.main", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}


def test_a_run_whose_wal_is_zeroed_while_it_runs_reports_the_damage_not_success(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(GATED)
    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    with running(_cli("run", "plan.yaml", "--journal", url, "--json", "--run-id", "r1", cwd=tmp_path),
                 env=_env(), cwd=tmp_path) as proc:
        read_until(proc, "run r1 started", stream="stderr")  # announced after run_created is committed
        wal = tmp_path / "runs.db-wal"
        size = wal.stat().st_size
        assert size > 0
        with wal.open("r+b") as handle:  # zeroed in place: the writer keeps its file open and goes on
            handle.write(b"\0" * size)
        (tmp_path / "open").write_text("")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    report = json.loads(out)
    assert report["status"] == "error", report
    assert "succeeded" not in out
    assert f"the journal file {db} is damaged" in report["error"]
    assert "write-ahead log" in report["error"]
    assert "Traceback" not in err

    for command in (["runs"], ["show", "r1"], ["resume", "r1"]):
        done = subprocess.run(_cli(*command, "--journal", url, cwd=tmp_path), capture_output=True, text=True,
                              env=_env(), cwd=tmp_path, timeout=120, check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        assert f"the journal file {db} is damaged" in done.stderr, (command, done.stderr)
        assert "restore it from a backup, or move it aside" in done.stderr


def test_a_file_that_is_not_a_database_is_named_with_what_to_do(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    db.write_bytes(b"\0" * 8192)
    done = subprocess.run(_cli("runs", "--journal", f"sqlite:///{db}", cwd=tmp_path), capture_output=True,
                          text=True, env=_env(), cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"the journal file {db} is damaged" in done.stderr


async def test_a_run_whose_pages_do_not_read_back_fails_its_final_flush(tmp_path: Path) -> None:
    """The WAL's header intact but its frames zeroed: only reading the run back on a new connection shows it (the
    writer's own connection serves the pages from its cache)."""
    journal = await SQLiteJournal.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        for i in range(2000):  # many pages: the early ones are not written again by the later events
            journal.append(Event("r1", "step_progress", float(i), "a", {"n": i, "pad": "x" * 200}))
        await journal.flush()
        wal = tmp_path / "runs.db-wal"
        size = wal.stat().st_size
        with wal.open("r+b") as handle:
            handle.seek(32)  # past the WAL's header
            handle.write(b"\0" * (size - 32))
        journal.append(Event("r1", "run_finished", 2000.0, None, {"status": "succeeded", "error": None}))
        with pytest.raises(JournalError, match="is damaged \\(the run 'r1' it just wrote does not read back"):
            await journal.flush()
    finally:
        with contextlib.suppress(JournalError):
            await journal.close()
