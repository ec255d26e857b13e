"""A disk that fills up mid-run: the run stops resumable, finished steps stay readable, a new process continues it.

The journal lives on a small tmpfs; a step (``fill``) fills it up, so the next journal write fails with SQLITE_FULL.
Every other step appends its id to a side-effect file outside the tmpfs, so the file counts how often each ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave import Engine, JournalError, RunError
from planweave.journal import open_journal
from tests.journal import effect_tools  # subprocesses load it by name: --tools effect_tools:toolbox

HERE = Path(__file__).parent

EFFECTS = ["e1", "e2", "e3", "e4"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs at ``tmp_path/disk`` (skipped where mounting is not permitted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _plan(tmp: Path, disk: Path) -> dict[str, Any]:
    log = str(tmp / "effects.log")
    steps: list[dict[str, Any]] = [
        {"id": "e1", "tool": "effect", "args": {"step": "e1", "log": log, "pad": 1000}},
        {"id": "e2", "tool": "effect", "args": {"step": "e2", "log": log, "pad": 1000}, "after": ["e1"]},
        {"id": "fill", "tool": "fill", "after": ["e2"], "args": {
            "ballast": str(disk / "ballast"), "once": str(tmp / "filled"), "db": str(disk / "runs.db"),
            "after_stored": "e2"}},
        {"id": "e3", "tool": "effect", "args": {"step": "e3", "log": log, "pad": 100_000}, "after": ["fill"]},
        {"id": "e4", "tool": "effect", "args": {"step": "e4", "log": log}, "after": ["e3"]},
    ]
    return {"steps": steps}


def _effects(tmp: Path) -> Counter[str]:
    path = tmp / "effects.log"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=90)


def test_a_full_disk_interrupts_the_run_and_resume_continues_it_once_space_returns(
    tmp_path: Path, small_disk: Path,
) -> None:
    url = f"sqlite:///{small_disk / 'runs.db'}"
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(_plan(tmp_path, small_disk)))
    tools = ("--tools", "effect_tools:toolbox")

    first = _cli(tmp_path, "run", str(plan), "--journal", url, "--run-id", "full", *tools)
    assert first.returncode != 0
    assert "full" in first.stderr and "Traceback" not in first.stderr, first.stderr
    assert "run 'full' was interrupted" in first.stderr and "resume it once the journal" in first.stderr
    assert _effects(tmp_path) == Counter({"e1": 1, "e2": 1})  # e3 never ran: its write-ahead record failed

    shown = _cli(tmp_path, "show", "full", "--journal", url, "--json")  # still full: reading works
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["status"] == "interrupted"
    assert {s: report["steps"][s]["status"] for s in ("e1", "e2")} == {"e1": "succeeded", "e2": "succeeded"}

    (small_disk / "ballast").unlink()  # space returns
    resumed = _cli(tmp_path, "resume", "full", "--journal", url, *tools)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _effects(tmp_path) == Counter(dict.fromkeys(EFFECTS, 1))  # nothing lost, nothing finished ran again
    conn = sqlite3.connect(small_disk / "runs.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finished = conn.execute("SELECT data FROM events WHERE run_id = 'full' AND kind = 'run_finished'").fetchall()
    finally:
        conn.close()
    assert [json.loads(d)["status"] for (d,) in finished] == ["succeeded"]


async def test_the_engine_stops_a_run_whose_journal_cannot_be_written(tmp_path: Path, small_disk: Path) -> None:
    url = f"sqlite:///{small_disk / 'runs.db'}"
    outcome: BaseException | None = None
    with pytest.raises(JournalError, match="full"):  # closing a journal that lost a write says so too
        async with open_journal(url) as journal, Engine(journal, tools=effect_tools.toolbox) as engine:
            run = await engine.start(_plan(tmp_path, small_disk), run_id="full")
            try:
                await run.wait()
            except RunError as exc:
                outcome = exc
            steps = {sid: rec.status for sid, rec in run.state.records.items()}
    assert isinstance(outcome, RunError)
    assert re.fullmatch(r"run 'full' was interrupted: could not write to the journal .*: database or disk is full; "
                        r"resume it once the journal can be written again", str(outcome)), outcome
    # The step whose start could not be recorded is not reported as a failure of its own: the run stopped.
    assert steps["e3"] != "failed"
    assert _effects(tmp_path) == Counter({"e1": 1, "e2": 1})
