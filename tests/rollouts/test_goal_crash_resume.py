"""A goal-run rollout process SIGKILLed mid-episode, then resumed: no sample is delivered twice or lost. Every
episode is in the sink once with all five of its model calls (planner, three steps, joiner) from one attempt; the
episodes in flight at the kill ran again from their start (their killed attempt's calls never delivered); nothing
acknowledged before the kill is delivered again."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

from planweave.rollouts.sinks import read_jsonl
from tests.processes import read_until, running

ROOT = Path(__file__).resolve().parents[2]


def _ids(lines: list[str], word: str) -> list[int]:
    return [int(x) for line in lines if line.startswith(word + " ") for x in line.split()[1:]]


def test_a_killed_goal_rollout_resumes_without_delivering_a_sample_twice_or_losing_one(tmp_path: Path) -> None:
    journal, sink = f"sqlite:///{tmp_path / 'rollouts.db'}", tmp_path / "samples.jsonl"
    argv = [sys.executable, "-m", "tests.rollouts.goal_crash_consumer", journal, str(sink)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with running([*argv, "1"], env=env, cwd=ROOT) as first:
        before = read_until(first, "hang")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    db = sqlite3.connect(tmp_path / "rollouts.db")
    in_flight = [row[0] for row in db.execute("SELECT id FROM rollout_episodes WHERE status = 'running'")]
    db.close()
    assert in_flight, "nothing was in flight at the kill"
    with running([*argv, "0"], env=env, cwd=ROOT) as second:
        out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    after = out.splitlines()
    acked_before = _ids(before, "acked")
    assert len(acked_before) == 2
    assert not set(acked_before) & set(_ids(after, "delivered"))  # nothing acked is delivered again
    assert set(in_flight) <= set(_ids(after, "restarted"))  # the in-flight episodes ran again from their start
    trajectories = read_jsonl(sink)
    assert sorted(t.episode for t in trajectories) == list(range(8))  # every episode once
    for trajectory in trajectories:
        samples = trajectory.samples
        assert [s.index for s in samples] == [0, 1, 2, 3, 4]  # all its calls, each once
        assert sorted(s.role for s in samples) == ["joiner", "planner", "step", "step", "step"]
        assert len({s.session for s in samples}) == 1 and len({s.run for s in samples}) == 1  # one attempt's calls
        assert all(s.episode == trajectory.episode and s.completion_token_ids for s in samples)
    keys = [(s.episode, s.session, s.index) for t in trajectories for s in t.samples]
    assert len(keys) == len(set(keys)) == 40
