"""Where delivered trajectories go besides the in-process iterator: a JSON Lines file, a directory of Parquet files,
a Redis stream for a trainer in another process. One interface (:class:`TrajectorySink`: ``write`` a batch, ``close``)
and, for each, a reader that gives the same trajectories back (the conformance suites in
``tests/rollouts/test_sinks.py`` and, across SIGKILLs, ``tests/rollouts/test_sink_crashes.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from planweave.extras import require
from planweave.rollouts.trajectory import Trajectory, TrajectoryError

if TYPE_CHECKING:
    import pyarrow


class TrajectorySink(Protocol):
    """Takes delivered trajectories. When ``write`` returns, the batch is durable and readable, so the consumer may
    acknowledge it; a trajectory the sink already holds (same ``meta["rollout"]`` and episode: a batch delivered again
    after a restart that came between the write and the ack) is not written twice. ``close`` releases the sink."""

    async def write(self, trajectories: Iterable[Trajectory]) -> None: ...

    async def close(self) -> None: ...


Identity = tuple[str, int]
"""A trajectory's (rollout journal id, episode): unique across the resumes of one journaled rollout."""


def rollout_of(trajectory: Trajectory) -> str:
    """The id of the rollout journal ``trajectory`` came from (``meta["rollout"]``), or "" if it has none."""
    rollout = trajectory.meta.get("rollout")
    return rollout if isinstance(rollout, str) else ""


def identity(trajectory: Trajectory) -> Identity | None:
    """What a sink recognises ``trajectory`` by; None for one without a rollout id (never taken for a duplicate)."""
    rollout = rollout_of(trajectory)
    return (rollout, trajectory.episode) if rollout else None


def _fresh(trajectories: Iterable[Trajectory], held: set[Identity]) -> list[Trajectory]:
    """The trajectories not in ``held`` (which then holds them too)."""
    out = []
    for t in trajectories:
        key = identity(t)
        if key is not None:
            if key in held:
                continue
            held.add(key)
        out.append(t)
    return out


def _held_in_jsonl(path: Path, lines: Iterable[bytes]) -> set[Identity]:
    held = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            key = identity(Trajectory.from_json(json.loads(line), f"{path}:{number}"))
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if key is not None:
            held.add(key)
    return held


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonlSink:
    """One trajectory per line (its :meth:`Trajectory.to_json`), appended, flushed and fsynced per batch. Opening an
    existing file drops a torn last line (a process killed mid-write: never acknowledged) and learns the
    trajectories it holds."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._held: set[Identity] = set()
        if self.path.exists():
            data = self.path.read_bytes()
            whole = data.rfind(b"\n") + 1
            if whole < len(data):
                os.truncate(self.path, whole)
            self._held = _held_in_jsonl(self.path, data[:whole].splitlines())
        self._file = self.path.open("a", encoding="utf-8")

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        rows = _fresh(trajectories, self._held)
        if rows:
            await asyncio.to_thread(self._append, [json.dumps(t.to_json()) + "\n" for t in rows])

    def _append(self, lines: list[str]) -> None:
        self._file.writelines(lines)
        self._file.flush()
        os.fsync(self._file.fileno())

    async def close(self) -> None:
        self._file.close()


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """The trajectories of a JSON Lines file; a bad line is a :class:`TrajectoryError` naming the file and line."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"{path}:{number}: not JSON ({exc.msg})") from None
        out.append(Trajectory.from_json(obj, f"{path}:{number}"))
    return out


def _parquet_schema() -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema([("episode", pa.int64()), ("seed", pa.int64()), ("reward", pa.float64()),
                      ("turns", pa.int32()), ("versions", pa.list_(pa.int64())),
                      ("interrupted", pa.bool_()), ("rollout", pa.string()), ("trajectory", pa.string())])


PART = re.compile(r"part-(\d+)\.parquet")
"""The name of a finished part of a Parquet sink's directory."""


def parquet_parts(path: str | Path) -> list[tuple[int, Path]]:
    """The finished parts of a Parquet sink's directory with their numbers, in the order they were written."""
    return sorted((int(m.group(1)), p) for p in Path(path).iterdir() if (m := PART.fullmatch(p.name)))


class ParquetSink:
    """A directory of Parquet files (pyarrow), one complete file per batch: ``PATH/part-00000.parquet``, ... Each
    part is written under a hidden temporary name (``.part-N.parquet.tmp``), fsynced, renamed and the directory
    fsynced before ``write`` returns, so an acknowledged batch is a readable file whatever happens after; a killed
    process leaves at most a temporary file, which the next one removes, and numbers its parts after the existing
    ones (it never rewrites one). Columns: those a trainer filters on (episode, seed, reward, turns, versions,
    interrupted, rollout) and the whole trajectory as JSON in ``trajectory``; ``pyarrow.dataset.dataset(PATH)`` or
    ``pandas.read_parquet(PATH)`` read the directory (they skip names starting with a dot)."""

    def __init__(self, path: str | Path) -> None:
        require("rollouts", "the Parquet trajectory sink")
        import pyarrow.parquet as pq

        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"sink {str(self.path)!r} is a file: the Parquet sink writes a directory of part files "
                             f"(PATH/part-00000.parquet, ...); move the file away or name another path")
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in self.path.glob(".part-*.parquet.tmp"):  # a killed write: never acknowledged
            stale.unlink()
        parts = parquet_parts(self.path)
        self._next = parts[-1][0] + 1 if parts else 0
        self._held: set[Identity] = set()
        for _, part in parts:
            table = pq.read_table(str(part), columns=["rollout", "episode"])
            self._held |= {(r, e) for r, e in zip(table.column("rollout").to_pylist(),
                                                  table.column("episode").to_pylist(), strict=True) if r}

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        import pyarrow as pa

        rows = _fresh(trajectories, self._held)
        if not rows:
            return
        columns: dict[str, list[Any]] = {
            "episode": [t.episode for t in rows], "seed": [t.seed for t in rows], "reward": [t.reward for t in rows],
            "turns": [len(t.turns) for t in rows], "versions": [list(t.versions) for t in rows],
            "interrupted": [bool(t.interruptions) for t in rows],
            "rollout": [rollout_of(t) or None for t in rows],
            "trajectory": [json.dumps(t.to_json()) for t in rows]}
        number, self._next = self._next, self._next + 1
        await asyncio.to_thread(self._write_part, pa.table(columns, schema=_parquet_schema()), number)

    def _write_part(self, table: pyarrow.Table, number: int) -> None:
        import pyarrow.parquet as pq

        name = f"part-{number:05d}.parquet"
        temporary = self.path / f".{name}.tmp"
        with temporary.open("wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path / name)
        _fsync_directory(self.path)

    async def close(self) -> None:
        return None


def read_parquet(path: str | Path) -> list[Trajectory]:
    """The trajectories a :class:`ParquetSink` wrote to the directory ``path``, part by part (or those of one
    Parquet file)."""
    require("rollouts", "reading Parquet trajectories")
    import pyarrow.parquet as pq

    out = []
    for part in [p for _, p in parquet_parts(path)] if Path(path).is_dir() else [Path(path)]:
        texts = pq.read_table(str(part), columns=["trajectory"]).column("trajectory").to_pylist()
        out += [Trajectory.from_json(json.loads(text), f"{part}: row {i}") for i, text in enumerate(texts)]
    return out


class RedisStreamSink:
    """A Redis stream (``XADD key * episode N rollout ID trajectory JSON``) a trainer in another process reads with
    ``XREAD`` (or a consumer group); ``maxlen`` trims it approximately. A batch is one ``MULTI``/``EXEC``; the
    first write reads the stream's ``rollout`` and ``episode`` fields to learn what it holds."""

    def __init__(self, url: str, key: str, *, maxlen: int | None = None) -> None:
        require("rollouts", "the Redis stream trajectory sink")
        import redis.asyncio

        self.key = key
        self.maxlen = maxlen
        self._redis = redis.asyncio.Redis.from_url(url)
        self._held: set[Identity] | None = None

    async def _learn(self) -> set[Identity]:
        held: set[Identity] = set()
        since = "-"
        while True:
            entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                           await self._redis.xrange(self.key, min=since, count=1000) or [])
            for _, fields in entries:
                rollout, episode = fields.get(b"rollout"), fields.get(b"episode")
                if rollout and episode is not None:
                    held.add((rollout.decode(), int(episode)))
            if len(entries) < 1000:
                return held
            since = "(" + entries[-1][0].decode()

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        if self._held is None:
            self._held = await self._learn()
        rows = _fresh(trajectories, self._held)
        if not rows:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for t in rows:
                fields = {"episode": t.episode, "rollout": rollout_of(t),
                          "trajectory": json.dumps(t.to_json())}
                pipe.xadd(self.key, fields, maxlen=self.maxlen,  # type: ignore[arg-type]
                          approximate=self.maxlen is not None)
            await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()


async def read_redis_stream(url: str, key: str, *, since: str = "0-0", count: int = 10_000) -> list[Trajectory]:
    """The trajectories in a Redis stream after entry ``since``."""
    require("rollouts", "reading a Redis stream of trajectories")
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    try:
        entries = await client.xrange(key, min=f"({since}" if since != "0-0" else "-", count=count)
    finally:
        await client.aclose()
    out = []
    for entry_id, fields in cast("list[tuple[bytes, dict[bytes, bytes]]]", entries or []):
        out.append(Trajectory.from_json(json.loads(fields[b"trajectory"]), f"redis {key} entry {entry_id.decode()}"))
    return out


def open_sink(target: str) -> TrajectorySink:
    """A sink from a target: ``PATH.jsonl``, ``PATH.parquet`` (a directory of part files) or
    ``redis://HOST:PORT/DB#STREAM_KEY``."""
    if target.startswith(("redis://", "rediss://")):
        url, _, key = target.partition("#")
        if not key:
            raise ValueError(f"sink {target!r}: a Redis sink names its stream after '#' (redis://host:6379/0#key)")
        return RedisStreamSink(url, key)
    if target.endswith(".jsonl"):
        return JsonlSink(target)
    if target.endswith(".parquet"):
        return ParquetSink(target)
    raise ValueError(f"sink {target!r}: use a .jsonl or .parquet path, or redis://host:port/db#stream")
