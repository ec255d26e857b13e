"""The rollout engine end to end on a scripted model server: trajectories, partial rollouts, drops, backpressure,
long-tailed episodes and the staleness bound checked from the delivered trajectories themselves."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave.models.openai import OpenAIChatClient
from planweave.rollouts import RolloutEngine, StalePolicy, Trajectory
from planweave.rollouts.toy import Countdown, pareto_length
from planweave.testing import ScriptedLLM, Text
from planweave.tools.safety import redact
from tests.processes import journal_bytes
from tests.rollouts.helpers import ok_policy, violations


def countdown(seed: int) -> Countdown:
    return Countdown(seed)


async def test_trajectories_are_complete_and_self_describing() -> None:
    async with ok_policy(logprobs=((-0.1, -2.0),)) as (server, client), \
            RolloutEngine(client, countdown, episodes=6, concurrency=3, logprobs=2) as rollouts:
        got = [t async for batch in rollouts.batches(size=4) for t in batch]
    assert sorted(t.episode for t in got) == list(range(6))
    for t in got:
        assert len(t.turns) == pareto_length(t.seed)
        assert t.reward == len(t.turns)  # every action was "ok"
        assert all(turn.action == "ok" and turn.version == 0 for turn in t.turns)
        assert t.turns[-1].done and t.turns[-1].observation == "0 turns left"
        assert t.turns[0].prompt == (("user", f"{len(t.turns)} turns left"),)
        assert all(turn.logprobs == ((-0.1, -2.0),) for turn in t.turns)  # the endpoint's logprobs, per token
        assert Trajectory.from_json(t.to_json()) == t
    assert len(server.chat_requests) == sum(len(t.turns) for t in got)


async def test_batches_come_oldest_policy_first_and_a_short_last_batch_ends_them() -> None:
    async with ok_policy() as (_, client), RolloutEngine(client, countdown, episodes=7, max_staleness=5) as rollouts:
        sizes = []
        async for batch in rollouts.batches(size=3):
            sizes.append(len(batch))
            oldest = [t.oldest_trainable for t in batch]
            assert oldest == sorted(oldest)  # type: ignore[type-var]
            await rollouts.update_policy()
    assert sizes == [3, 3, 1]


async def test_partial_rollout_interrupts_and_resumes_on_the_new_policy_each_call_tagged() -> None:
    async with ok_policy(ttft=0.02) as (server, client), \
            RolloutEngine(client, lambda seed: Countdown(seed, turns=4), episodes=12, concurrency=4,
                          max_staleness=0, on_stale="partial") as rollouts:
        got: list[tuple[int, list[Trajectory]]] = []
        async for batch in rollouts.batches(size=2):
            got.append((batch.version, list(batch)))
            await rollouts.update_policy()
    interrupted = [t for _, ts in got for t in ts if t.interruptions]
    assert interrupted, "no episode was in flight at an update"
    for version, ts in got:
        for t in ts:
            assert all(turn.version == version for turn in t.turns if turn.trainable)  # k = 0
    for t in interrupted:
        assert t.versions == tuple(sorted(t.versions))
        assert [turn.trainable for turn in t.turns] == [turn.version == t.versions[-1] for turn in t.turns]
        assert [i.to_version for i in t.interruptions] == sorted(i.to_version for i in t.interruptions)
    mixed = [t for t in interrupted if len(set(t.versions)) > 1]
    assert mixed, "no interrupted episode kept turns of an older policy"  # kept part, then the newer policy
    # calls in flight at an update were re-issued on the new policy: the server saw more calls than turns
    assert rollouts.stats.interrupted >= len(interrupted)
    assert len(server.chat_requests) > sum(len(t.turns) for _, b in got for t in b)


async def test_drop_discards_episodes_past_the_bound_and_refills_the_pool() -> None:
    async with ok_policy(ttft=0.02) as (_, client), \
            RolloutEngine(client, lambda seed: Countdown(seed, turns=4), episodes=10, concurrency=4,
                          max_staleness=0, on_stale="drop") as rollouts:
        got: list[Trajectory] = []
        async for batch in rollouts.batches(size=2):
            got.extend(batch)
            assert violations(batch, 0) == []
            await rollouts.update_policy()
    assert rollouts.stats.dropped_in_flight > 0
    assert len(got) == 10 and all(all(turn.trainable for turn in t.turns) and not t.interruptions for t in got)


async def test_backpressure_pauses_production_while_the_consumer_lags() -> None:
    async with ok_policy() as (_, client), \
            RolloutEngine(client, countdown, episodes=100, concurrency=4, max_lag_batches=2) as rollouts:
        batches = rollouts.batches(size=4)
        first = await anext(batches)
        await rollouts.settled()  # the consumer holds its batch; the episodes in flight finish, no new one starts
        started, waiting = rollouts.stats.started, rollouts.waiting
        assert rollouts.running == 0 and 8 <= waiting <= 8 + 3
        assert started == len(first) + waiting < 100
        assert rollouts.stats.paused > 0
        rest = [t async for batch in batches for t in batch]
    assert len(first) + len(rest) == 100


async def test_a_long_episode_never_stalls_a_batch() -> None:
    # episode 0 runs 40 turns, the others one: batches flow while it runs (a synchronous batch would wait for it)
    def env(seed: int) -> Countdown:
        return Countdown(seed, cap=40) if seed else _long()

    async with ok_policy(ttft=0.005) as (_, client), \
            RolloutEngine(client, env, episodes=20, concurrency=4, max_staleness=100) as rollouts:
        order = [t.episode async for batch in rollouts.batches(size=4) for t in batch]
    assert order.index(0) >= 12


def _long() -> Countdown:
    return Countdown(0, turns=40)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(0, 3), policy=st.sampled_from(["partial", "drop"]), concurrency=st.integers(1, 6),
       size=st.integers(1, 4), updates=st.lists(st.integers(0, 2), min_size=1, max_size=8), seed=st.integers(0, 99))
def test_no_delivered_trajectory_exceeds_the_staleness_bound(k: int, policy: StalePolicy, concurrency: int, size: int,
                                                             updates: list[int], seed: int) -> None:
    async def main() -> list[str]:
        problems: list[str] = []
        async with ok_policy(ttft=0.001) as (_, client), \
                RolloutEngine(client, lambda s: Countdown(s, cap=12), episodes=12, concurrency=concurrency,
                              max_staleness=k, on_stale=policy, seed=seed) as rollouts:
            n = 0
            async for batch in rollouts.batches(size=size):
                problems += [f"batch {batch.number} at v{batch.version}: {v}" for v in violations(batch, k)]
                if policy == "drop":
                    problems += [f"episode {t.episode} kept untrainable turns" for t in batch
                                 if not all(turn.trainable for turn in t.turns)]
                for _ in range(updates[n % len(updates)]):  # 0, 1 or 2 updates between batches
                    await rollouts.update_policy()
                n += 1
        return problems

    assert asyncio.run(main()) == []


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"max_staleness": -1}, {"on_stale": "keep"},
                                 {"max_lag_batches": 0}, {"episodes": -2}])
async def test_bad_options_are_refused_naming_them(bad: dict[str, object]) -> None:
    async with ok_policy() as (_, client):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RolloutEngine(client, countdown, **bad)  # type: ignore[arg-type]


async def test_redact_rewrites_what_is_delivered_and_journaled_not_what_the_policy_sees(tmp_path: Path) -> None:
    secret = "sk-unit-0123456789abcdef"
    server = ScriptedLLM(default=Text(f"ok {secret}"))
    async with server as url, OpenAIChatClient("scripted", base_url=url, api_key="test") as client, \
            RolloutEngine(client, lambda s: Countdown(s, turns=2), episodes=3, journal=f"sqlite:///{tmp_path / 'r.db'}",
                          system=f"the key is {secret}", redact=partial(redact, secrets=[secret])) as rollouts:
        got = [t async for batch in rollouts.batches(size=3) for t in batch]
    assert len(got) == 3 and secret not in json.dumps([t.to_json() for t in got])
    assert all(turn.action == "ok ***" and turn.prompt[0] == ("system", "the key is ***") for t in got
               for turn in t.turns)
    assert all(secret in json.dumps(r.body) for r in server.chat_requests)  # the live prompts were not rewritten
    assert secret.encode() not in journal_bytes(tmp_path, "r.db")
