"""The rollout journal: episodes, their turns as they happen, finished trajectories and the consumer's acks, in
SQLite, so a killed rollout process resumes its in-flight episodes and never re-delivers an acknowledged trajectory.

An episode row moves ``running`` → ``finished`` → ``acked`` (or ``dropped``); its turns are journaled one by one,
so a resumed episode replays them into a fresh environment (same seed: environments must be deterministic in their
seed and actions) and carries on from there. Each write commits at once (WAL): a turn is durable before the next
model call starts. The journal has an id (``rollout_meta.id``, drawn when it is created) that every trajectory of it
carries in ``meta["rollout"]``: with the episode, what a sink recognises a trajectory delivered again by.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from planweave.rollouts.trajectory import Interruption, Trajectory, TrajectoryError, Turn

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollout_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_episodes (
  id INTEGER PRIMARY KEY, seed INTEGER NOT NULL, status TEXT NOT NULL, observation TEXT,
  interruptions TEXT NOT NULL DEFAULT '[]', trajectory TEXT);
CREATE TABLE IF NOT EXISTS rollout_turns (
  episode INTEGER NOT NULL, idx INTEGER NOT NULL, turn TEXT NOT NULL, PRIMARY KEY (episode, idx));
"""


@dataclass(frozen=True, slots=True)
class InFlight:
    """An episode the journal saw start but neither finish nor be dropped: what a resume replays."""

    episode: int
    seed: int
    observation: str | None
    turns: tuple[Turn, ...]
    interruptions: tuple[Interruption, ...]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a journal holds when a rollout engine opens it."""

    version: int
    next_episode: int
    in_flight: tuple[InFlight, ...]
    unacked: tuple[Trajectory, ...]  # finished, maybe delivered, not acknowledged: delivered (again)
    acked: int
    rollout: str  # the journal's id (a fresh one without a journal)


class RolloutJournal(Protocol):
    """Where a rollout engine records episodes and acks (:class:`SqliteRolloutJournal`, :class:`NoJournal`)."""

    def recover(self) -> Recovered: ...
    def set_version(self, version: int) -> None: ...
    def started(self, episode: int, seed: int, observation: str) -> None: ...
    def turn(self, episode: int, turn: Turn, interruptions: Iterable[Interruption]) -> None: ...
    def finished(self, trajectory: Trajectory) -> None: ...
    def dropped(self, episode: int) -> None: ...
    def acked(self, episodes: Iterable[int]) -> None: ...
    def close(self) -> None: ...


class NoJournal:
    """Nothing is kept: a restarted process starts over."""

    def recover(self) -> Recovered:
        return Recovered(0, 0, (), (), 0, uuid.uuid4().hex)

    def set_version(self, version: int) -> None: ...
    def started(self, episode: int, seed: int, observation: str) -> None: ...
    def turn(self, episode: int, turn: Turn, interruptions: Iterable[Interruption]) -> None: ...
    def finished(self, trajectory: Trajectory) -> None: ...
    def dropped(self, episode: int) -> None: ...
    def acked(self, episodes: Iterable[int]) -> None: ...
    def close(self) -> None: ...


def journal_path(url: str) -> Path:
    """The file of ``sqlite:///PATH`` (or a plain path); anything else is a ValueError naming it."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    if "://" in url:
        raise ValueError(f"rollout journal {url!r}: only sqlite:///PATH journals are supported")
    return Path(url)


class SqliteRolloutJournal:
    """The journal in one SQLite file (WAL); see the module docstring."""

    def __init__(self, url: str) -> None:
        self.path = journal_path(url)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO rollout_meta VALUES ('id', ?)", (uuid.uuid4().hex,))

    def recover(self) -> Recovered:
        db = self._db
        row = db.execute("SELECT value FROM rollout_meta WHERE key = 'version'").fetchone()
        version = int(row[0]) if row else 0
        top = db.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM rollout_episodes").fetchone()[0]
        in_flight = []
        for ep, seed, obs, inter in db.execute(
                "SELECT id, seed, observation, interruptions FROM rollout_episodes WHERE status = 'running' "
                "ORDER BY id").fetchall():
            turns = tuple(Turn.from_json(json.loads(t), f"{self.path}: episode {ep} turn {i}") for i, t in
                          db.execute("SELECT idx, turn FROM rollout_turns WHERE episode = ? ORDER BY idx", (ep,)))
            in_flight.append(InFlight(ep, seed, obs, turns, tuple(Interruption(*i) for i in json.loads(inter))))
        unacked = []
        for ep, text in db.execute("SELECT id, trajectory FROM rollout_episodes WHERE status = 'finished' "
                                   "ORDER BY id").fetchall():
            try:
                unacked.append(Trajectory.from_json(json.loads(text), f"{self.path}: episode {ep}"))
            except json.JSONDecodeError as exc:
                raise TrajectoryError(f"{self.path}: episode {ep}: trajectory is not JSON ({exc})") from None
        acked = db.execute("SELECT COUNT(*) FROM rollout_episodes WHERE status = 'acked'").fetchone()[0]
        rollout = db.execute("SELECT value FROM rollout_meta WHERE key = 'id'").fetchone()[0]
        return Recovered(version, int(top), tuple(in_flight), tuple(unacked), int(acked), str(rollout))

    def set_version(self, version: int) -> None:
        self._db.execute("INSERT INTO rollout_meta VALUES ('version', ?) ON CONFLICT(key) DO UPDATE SET "
                         "value = excluded.value", (str(version),))

    def started(self, episode: int, seed: int, observation: str) -> None:
        with self._db:  # also an episode started again from its first turn (its journaled turns could not replay)
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO rollout_episodes (id, seed, status, observation) "
                             "VALUES (?, ?, 'running', ?)", (episode, seed, observation))
            self._db.execute("DELETE FROM rollout_turns WHERE episode = ?", (episode,))

    def turn(self, episode: int, turn: Turn, interruptions: Iterable[Interruption]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO rollout_turns VALUES (?, ?, ?)",
                             (episode, turn.index, json.dumps(turn.to_json())))
            self._db.execute("UPDATE rollout_episodes SET interruptions = ? WHERE id = ?",
                             (json.dumps([[i.at, i.from_version, i.to_version] for i in interruptions]), episode))

    def finished(self, trajectory: Trajectory) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("UPDATE rollout_episodes SET status = 'finished', trajectory = ? WHERE id = ?",
                             (json.dumps(trajectory.to_json()), trajectory.episode))
            self._db.execute("DELETE FROM rollout_turns WHERE episode = ?", (trajectory.episode,))

    def dropped(self, episode: int) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("UPDATE rollout_episodes SET status = 'dropped', trajectory = NULL WHERE id = ?",
                             (episode,))
            self._db.execute("DELETE FROM rollout_turns WHERE episode = ?", (episode,))

    def acked(self, episodes: Iterable[int]) -> None:
        ids = [(e,) for e in episodes]
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("UPDATE rollout_episodes SET status = 'acked', trajectory = NULL WHERE id = ?", ids)

    def close(self) -> None:
        self._db.close()


def open_rollout_journal(url: str | None) -> RolloutJournal:
    """The journal at ``url`` (``sqlite:///PATH``), or :class:`NoJournal` for None."""
    return NoJournal() if url is None else SqliteRolloutJournal(url)
