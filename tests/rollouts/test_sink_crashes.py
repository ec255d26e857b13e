"""Every sink across SIGKILLs: ``planweave rollouts run`` as a real process, killed at moments the scripted server
picks (after so many model calls) and started again on the same journal and sink; every acknowledged trajectory is
readable from the sink right after each kill, and at the end every episode is there exactly once. And no secret of
the rollout process's environment, said by the environment or the policy, is stored in a sink or the journal.
One suite over JSON Lines, Parquet and a real Redis stream (127.0.0.1:6379, a unique key per test, deleted after)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from planweave.rollouts import Trajectory
from planweave.rollouts.sinks import read_jsonl, read_parquet, read_redis_stream
from planweave.rollouts.toy import pareto_length
from tests.processes import journal_bytes, running
from tests.rollouts.helpers import CountingServer

ROOT = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/0"
EPISODES = 40


@dataclass(frozen=True)
class Sink:
    target: str
    read: Callable[[], list[Trajectory]]
    stored: Callable[[], bytes]  # every byte the sink keeps, as stored (files) or as its entries' fields (Redis)


def _files(path: Path) -> bytes:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return b"".join(f.read_bytes() for f in files if f.exists())


async def _entries(key: str) -> bytes:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS)
    try:
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", await client.xrange(key))
    finally:
        await client.aclose()
    return b"".join(value for _, fields in entries for value in fields.values())


@pytest.fixture(params=["jsonl", "parquet", "redis"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sink]:
    if request.param == "redis":
        import redis

        key = f"planweave-test-rollouts-{uuid.uuid4().hex}"
        yield Sink(f"{REDIS}#{key}", lambda: asyncio.run(read_redis_stream(REDIS, key)),
                   lambda: asyncio.run(_entries(key)))
        client = redis.Redis.from_url(REDIS)
        client.delete(key)
        client.close()
        return
    path = tmp_path / f"out.{request.param}"
    yield Sink(str(path), lambda: (read_jsonl if request.param == "jsonl" else read_parquet)(path),
               lambda: _files(path))


def _config(tmp_path: Path, url: str, sink: Sink, env: str, *, episodes: int = EPISODES) -> Path:
    config = tmp_path / "rollouts.yaml"
    config.write_text(f"policy: {{base_url: {url}, api_key_env: OPENAI_API_KEY}}\nenv: {env}\nepisodes: {episodes}\n"
                      f"batch: 4\nconcurrency: 4\nmax_staleness: 100\njournal: sqlite:///{tmp_path / 'r.db'}\n"
                      f"sink: '{sink.target}'\n")
    return config


def _acked(tmp_path: Path) -> set[int]:
    db = sqlite3.connect(tmp_path / "r.db")
    try:
        return {row[0] for row in db.execute("SELECT id FROM rollout_episodes WHERE status = 'acked'")}
    finally:
        db.close()


def _run(config: Path, server: CountingServer, kill_at: list[int], env: dict[str, str],
         after_kill: Callable[[], None]) -> None:
    """The rollouts of ``config`` killed once the server has served each of ``kill_at`` calls, then to the end."""
    argv = [sys.executable, "-m", "planweave.cli.main", "rollouts", "run", str(config)]
    for calls in kill_at:
        with running(argv, env=env, cwd=ROOT) as proc:
            assert server.wait_for(calls), f"the rollouts made {server.calls} calls, not {calls}"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        after_kill()
    with running(argv, env=env, cwd=ROOT) as proc:
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err


def test_every_acknowledged_trajectory_survives_kills_exactly_once(tmp_path: Path, sink: Sink) -> None:
    server = CountingServer()
    total = sum(pareto_length(seed) for seed in range(EPISODES))  # the calls the episodes need at least
    kills: list[tuple[set[int], list[int]]] = []

    def after_kill() -> None:
        kills.append((_acked(tmp_path), [t.episode for t in sink.read()]))

    with server.serving() as url:
        config = _config(tmp_path, url, sink, "planweave.rollouts.toy:Countdown")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test"}
        _run(config, server, [total // 4, total // 2, 3 * total // 4], env, after_kill)
    assert any(acked for acked, _ in kills), "no batch was acknowledged before a kill"
    for n, (acked, readable) in enumerate(kills, start=1):
        assert acked <= set(readable), f"kill {n}: acknowledged episodes lost: {sorted(acked - set(readable))}"
        assert len(readable) == len(set(readable)), f"kill {n}: episodes written twice"
    got = [t.episode for t in sink.read()]
    assert sorted(got) == list(range(EPISODES))  # 0 lost, 0 duplicated
    assert _acked(tmp_path) == set(range(EPISODES))


def test_no_secret_said_by_the_environment_or_the_policy_is_stored(tmp_path: Path, sink: Sink) -> None:
    secret = f"sk-test-{uuid.uuid4().hex}"
    server = CountingServer(reply=f"ok, the key is {secret}")

    def after_kill() -> None:
        assert secret.encode() not in journal_bytes(tmp_path, "r.db") + sink.stored()
        db = sqlite3.connect(tmp_path / "r.db")
        try:
            turns.append(db.execute("SELECT COUNT(*) FROM rollout_turns").fetchone()[0])
        finally:
            db.close()

    turns: list[int] = []

    with server.serving() as url:
        config = _config(tmp_path, url, sink, "tests.rollouts.leaky:Leaky", episodes=12)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": secret}
        _run(config, server, [18], env, after_kill)  # 36 calls in all: killed half way, a resume replays turns
    assert turns[0] > 0, "no journaled turn to replay at the kill"
    assert any(secret in prompt for prompt in server.prompts)  # the policy was shown the secret: it was live
    got = sink.read()
    assert sorted(t.episode for t in got) == list(range(12))
    # every action said the key: an episode whose redacted actions could not be replayed was played again, live
    assert [t.reward for t in got] == [3.0] * 12
    assert all("***" in t.observation and all("***" in turn.action for turn in t.turns) for t in got)
    assert secret not in json.dumps([t.to_json() for t in got])
    assert secret.encode() not in sink.stored()
    db = sqlite3.connect(tmp_path / "r.db")
    try:
        rows = [row for table in ("rollout_meta", "rollout_episodes", "rollout_turns")
                for row in db.execute(f"SELECT * FROM {table}")]
    finally:
        db.close()
    assert rows and secret not in repr(rows)
    assert secret.encode() not in journal_bytes(tmp_path, "r.db")
