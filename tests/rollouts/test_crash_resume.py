"""A rollout process killed with SIGKILL while episodes are in flight resumes them from its journal, and delivers
every trajectory exactly once counting acknowledged deliveries: nothing acked before the kill comes again."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

from tests.processes import read_until, running

ROOT = Path(__file__).resolve().parents[2]


def _ids(lines: list[str], word: str) -> list[int]:
    return [int(x) for line in lines if line.startswith(word + " ") for x in line.split()[1:]]


def test_a_killed_rollout_resumes_in_flight_episodes_without_redelivering_acked_ones(tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path / 'rollouts.db'}"
    argv = [sys.executable, "-m", "tests.rollouts.crash_consumer", journal]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with running([*argv, "2"], env=env, cwd=ROOT) as first:
        before = read_until(first, "hang")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    db = sqlite3.connect(tmp_path / "rollouts.db")
    in_flight = [row[0] for row in db.execute("SELECT id FROM rollout_episodes WHERE status = 'running'")]
    turns_kept = db.execute("SELECT COUNT(*) FROM rollout_turns").fetchone()[0]
    db.close()
    assert in_flight and turns_kept > 0, "nothing was in flight at the kill"
    with running([*argv, "0"], env=env, cwd=ROOT) as second:
        out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    after = out.splitlines()
    acked_before, acked_after = _ids(before, "acked"), _ids(after, "acked")
    assert len(acked_before) == 8
    assert not set(acked_before) & set(_ids(after, "delivered"))  # no acked trajectory delivered again
    assert sorted(acked_before + acked_after) == list(range(24))  # every episode exactly once
    assert set(in_flight) <= set(_ids(after, "resumed"))  # the in-flight ones were resumed, not restarted
