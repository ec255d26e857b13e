"""One suite for every trajectory sink: what a rollout delivers is read back the same from JSON Lines, Parquet and a
real Redis stream (127.0.0.1:6379, a unique key per test, deleted after)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from planweave.rollouts import RolloutEngine, Trajectory, TrajectoryError
from planweave.rollouts.sinks import JsonlSink, ParquetSink, open_sink, read_jsonl, read_parquet, read_redis_stream
from planweave.rollouts.toy import Countdown
from tests.rollouts.helpers import ok_policy

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["jsonl", "parquet", "redis"])
async def target(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[str, Callable[[], Awaitable[list[Trajectory]]]]]:
    kind = request.param
    if kind == "redis":
        import redis.asyncio

        key = f"planweave-test-rollouts-{uuid.uuid4().hex}"

        async def read_stream() -> list[Trajectory]:
            return await read_redis_stream(REDIS, key)

        yield f"{REDIS}#{key}", read_stream
        client = redis.asyncio.Redis.from_url(REDIS)
        await client.delete(key)
        await client.aclose()
        return
    path = tmp_path / f"out.{kind}"

    async def read_file() -> list[Trajectory]:
        return read_jsonl(path) if kind == "jsonl" else read_parquet(path)

    yield str(path), read_file


async def test_a_sink_gives_back_every_delivered_trajectory(
        target: tuple[str, Callable[[], Awaitable[list[Trajectory]]]]) -> None:
    where, read = target
    sink = open_sink(where)
    delivered: list[Trajectory] = []
    async with ok_policy(logprobs=((-0.5, -1.5),)) as (_, client), \
            RolloutEngine(client, lambda s: Countdown(s, cap=5), episodes=7, logprobs=2) as rollouts:
        async for batch in rollouts.batches(size=3):
            await sink.write(batch)
            delivered.extend(batch)
            await rollouts.update_policy()
    await sink.close()
    back = await read()
    assert back == delivered and len(back) == 7
    assert all(turn.logprobs == ((-0.5, -1.5),) for t in back for turn in t.turns)


def _finished(episode: int, rollout: str = "r1") -> Trajectory:
    return Trajectory(episode, episode, f"episode {episode}", (), 0.0, meta={"rollout": rollout})


async def test_a_batch_delivered_again_after_a_restart_is_not_written_twice(
        target: tuple[str, Callable[[], Awaitable[list[Trajectory]]]]) -> None:
    where, read = target
    first = open_sink(where)
    await first.write([_finished(0), _finished(1), _finished(2)])  # then killed before the ack
    await first.close()
    again = open_sink(where)  # the restarted process: 1 and 2 come again, with 4
    await again.write([_finished(4), _finished(1), _finished(2)])
    await again.write([_finished(3), _finished(0, rollout="r2")])  # another rollout's episode 0 is not a duplicate
    await again.close()
    assert [(t.episode, t.meta["rollout"]) for t in await read()] == [
        (0, "r1"), (1, "r1"), (2, "r1"), (4, "r1"), (3, "r1"), (0, "r2")]


def test_a_torn_last_jsonl_line_is_dropped_when_the_sink_opens(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(_finished(0).to_json()) + "\n" + json.dumps(_finished(1).to_json())[:30])
    sink = JsonlSink(path)
    asyncio.run(sink.write([_finished(1)]))
    asyncio.run(sink.close())
    assert [t.episode for t in read_jsonl(path)] == [0, 1]


def test_parquet_parts_read_as_one_dataset_and_a_killed_write_leaves_no_part(tmp_path: Path) -> None:
    import pyarrow.dataset

    path = tmp_path / "out.parquet"
    sink = ParquetSink(path)
    asyncio.run(sink.write([_finished(0), _finished(1)]))
    asyncio.run(sink.write([_finished(2)]))
    (path / ".part-00002.parquet.tmp").write_bytes(b"PAR1 half a file")  # a process killed mid-write
    ParquetSink(path)
    assert sorted(p.name for p in path.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    table = pyarrow.dataset.dataset(path, format="parquet").to_table(columns=["episode", "rollout"])
    assert sorted(table.column("episode").to_pylist()) == [0, 1, 2]
    assert [t.episode for t in read_parquet(path)] == [0, 1, 2]


def test_a_parquet_sink_refuses_a_file_where_its_directory_goes(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"old\.parquet.* is a file"):
        ParquetSink(path)


def test_a_bad_line_is_named_with_its_file_and_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"episode": 1}\nnot json\n')
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:1: missing or bad field"):
        read_jsonl(path)


@pytest.mark.parametrize("where", ["out.csv", "redis://127.0.0.1:6379/0"])
def test_an_unknown_sink_is_refused_naming_it(where: str) -> None:
    with pytest.raises(ValueError, match="sink"):
        open_sink(where)


async def test_a_sink_carries_a_goal_episodes_samples(
        target: tuple[str, Callable[[], Awaitable[list[Trajectory]]]]) -> None:
    """The new fields (one sample per model call: ids, logprobs, role, step, policy version) come back whole."""
    from planweave.rollouts.samples import Sample

    where, read = target
    samples = tuple(Sample(episode=1, index=i, session="sess", run="run-1", plan_version=1,
                           step=None if i == 0 else f"s{i}", role="planner" if i == 0 else "step",
                           messages=({"role": "user", "content": f"q{i}"},), text=f"a{i}", finish_reason="stop",
                           policy_version=3, prompt_token_ids=(1, 2, i), completion_token_ids=(97, 48 + i),
                           logprobs=(-0.25, -1.5), ids_from="server", reward=0.5, trainable=i != 2, resampled=i % 2)
                    for i in range(3))
    trajectory = Trajectory(1, 1, "a goal", (), 0.5, meta={"rollout": "r1"}, samples=samples)
    sink = open_sink(where)
    await sink.write([trajectory])
    await sink.close()
    assert await read() == [trajectory]
