"""One suite for every trajectory sink: what a rollout delivers is read back the same from JSON Lines, Parquet and a
real Redis stream (127.0.0.1:6379, a unique key per test, deleted after)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from planweave.rollouts import RolloutEngine, Trajectory, TrajectoryError
from planweave.rollouts.sinks import open_sink, read_jsonl, read_parquet, read_redis_stream
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


def test_a_bad_line_is_named_with_its_file_and_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"episode": 1}\nnot json\n')
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:1: missing or bad field"):
        read_jsonl(path)


@pytest.mark.parametrize("where", ["out.csv", "redis://127.0.0.1:6379/0"])
def test_an_unknown_sink_is_refused_naming_it(where: str) -> None:
    with pytest.raises(ValueError, match="sink"):
        open_sink(where)
