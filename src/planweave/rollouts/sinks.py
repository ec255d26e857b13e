"""Where delivered trajectories go besides the in-process iterator: JSON Lines and Parquet files, a Redis stream for a
trainer in another process. One interface (:class:`TrajectorySink`: ``write`` a batch, ``close``) and, for each, a
reader that gives the same trajectories back (the conformance suite in ``tests/rollouts/test_sinks.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from planweave.extras import require
from planweave.rollouts.trajectory import Trajectory, TrajectoryError

if TYPE_CHECKING:
    import pyarrow


class TrajectorySink(Protocol):
    """Takes delivered trajectories; ``close`` makes everything written durable."""

    async def write(self, trajectories: Iterable[Trajectory]) -> None: ...

    async def close(self) -> None: ...


class JsonlSink:
    """One trajectory per line (its :meth:`Trajectory.to_json`), appended and flushed per batch."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        self._file.writelines(json.dumps(t.to_json()) + "\n" for t in trajectories)
        self._file.flush()

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
                      ("interrupted", pa.bool_()), ("trajectory", pa.string())])


class ParquetSink:
    """A Parquet file (pyarrow), one row group per batch: the columns a trainer filters on (episode, seed, reward,
    turns, versions, interrupted) and the whole trajectory as JSON in ``trajectory``."""

    def __init__(self, path: str | Path) -> None:
        require("rollouts", "the Parquet trajectory sink")
        import pyarrow.parquet as pq

        self.path = Path(path)
        self._writer = pq.ParquetWriter(str(self.path), _parquet_schema())

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        import pyarrow as pa

        rows = list(trajectories)
        if not rows:
            return
        columns: dict[str, list[Any]] = {
            "episode": [t.episode for t in rows], "seed": [t.seed for t in rows], "reward": [t.reward for t in rows],
            "turns": [len(t.turns) for t in rows], "versions": [list(t.versions) for t in rows],
            "interrupted": [bool(t.interruptions) for t in rows],
            "trajectory": [json.dumps(t.to_json()) for t in rows]}
        self._writer.write_table(pa.table(columns, schema=_parquet_schema()))

    async def close(self) -> None:
        self._writer.close()


def read_parquet(path: str | Path) -> list[Trajectory]:
    """The trajectories of a Parquet file a :class:`ParquetSink` wrote."""
    require("rollouts", "reading Parquet trajectories")
    import pyarrow.parquet as pq

    table = pq.read_table(str(path), columns=["trajectory"])
    return [Trajectory.from_json(json.loads(text), f"{path}: row {i}")
            for i, text in enumerate(table.column("trajectory").to_pylist())]


class RedisStreamSink:
    """A Redis stream (``XADD key * trajectory JSON``) a trainer in another process reads with ``XREAD`` (or a
    consumer group); ``maxlen`` trims it approximately."""

    def __init__(self, url: str, key: str, *, maxlen: int | None = None) -> None:
        require("rollouts", "the Redis stream trajectory sink")
        import redis.asyncio

        self.key = key
        self.maxlen = maxlen
        self._redis = redis.asyncio.Redis.from_url(url)

    async def write(self, trajectories: Iterable[Trajectory]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for t in trajectories:
                pipe.xadd(self.key, {"trajectory": json.dumps(t.to_json())}, maxlen=self.maxlen,
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
    """A sink from a target: ``PATH.jsonl``, ``PATH.parquet`` or ``redis://HOST:PORT/DB#STREAM_KEY``."""
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
