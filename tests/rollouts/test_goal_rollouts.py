"""Goal runs as rollout episodes through the gateway (issue 31): one sample per model call with the server's exact
token ids, roles and steps told apart across parallel steps, episodes on their own endpoints, rewards, and the
staleness bound applied per call. The policy server is the toy vLLM-dialect server (byte-level token ids)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from planweave.api import open_engine
from planweave.engine.runtime import Engine
from planweave.models import resolve_model
from planweave.rollouts import Trajectory
from planweave.rollouts.gateway import Gateway
from planweave.rollouts.goals import EpisodeOutcome, EpisodeSpec, GoalRollouts, samples_of
from planweave.rollouts.toy_policy import ToyPolicyServer, decode, encode, goal_replies, purpose_of, render


@asynccontextmanager
async def stack(toy: ToyPolicyServer, dialect: Any = "vllm") -> AsyncIterator[tuple[Gateway, Engine]]:
    async with toy.serve() as upstream, Gateway(upstream, dialect=dialect) as gateway, \
            open_engine("memory://") as engine:
        yield gateway, engine


def goal(seed: int) -> EpisodeSpec:
    return EpisodeSpec(goal=f"Name three colours (episode {seed}).", budget_tokens=50_000, deadline=60)


async def collect(rollouts: GoalRollouts, size: int) -> list[Trajectory]:
    out: list[Trajectory] = []
    async for batch in rollouts.batches(size=size):
        out += list(batch)
    return out


async def test_a_goal_run_with_three_parallel_steps_gives_one_sample_per_model_call_with_exact_tokens() -> None:
    toy = ToyPolicyServer(goal_replies(steps=3), delay=0.2)  # long enough for the three steps to overlap
    async with stack(toy) as (gateway, engine), \
            GoalRollouts(gateway, engine, episodes_from=goal, episodes=1, concurrency=1) as rollouts:
        [episode] = await collect(rollouts, 1)
    assert episode.meta["status"] == "succeeded" and episode.reward == 1.0
    assert toy.max_in_flight == 3  # the three steps' calls were in flight together
    samples = episode.samples
    assert len(samples) == toy.calls == 5  # one per model call: planner, three steps, joiner
    assert samples[0].role == "planner" and samples[-1].role == "joiner"
    assert sorted((s.role, s.step) for s in samples[1:4]) == [("step", "s0"), ("step", "s1"), ("step", "s2")]
    assert {s.run for s in samples} == {episode.meta["run"]}
    assert all(s.plan_version is not None and s.plan_version >= 1 for s in samples)
    for sample in samples:
        assert sample.completion_token_ids is not None and sample.prompt_token_ids is not None
        assert decode(sample.completion_token_ids) == sample.text  # the ids decode back to the text returned
        assert list(sample.prompt_token_ids) == encode(render(sample.messages))  # the server's own prompt ids
        assert sample.logprobs is not None and len(sample.logprobs) == len(sample.completion_token_ids)
        assert sample.finish_reason == "stop" and sample.policy_version == 0 and sample.ids_from == "server"
    step_texts = {s.step: s.text for s in samples if s.role == "step"}
    assert all(text in ("blue", "red", "green", "amber") for text in step_texts.values())
    assert all(body.get("return_token_ids") and body.get("logprobs") for body in toy.bodies)


async def test_concurrent_episodes_on_their_own_endpoints_never_cross() -> None:
    """Four episodes at once on one engine, each on its own session: every sample is its own episode's (messages,
    reply, run and role: a step's task may inherit another run's planner context, the tags must not follow it)."""
    def replies(messages: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
        text = " ".join(str(m.get("content")) for m in messages)
        found = re.search(r"episode (\d+)", text)
        marker = f"episode {found.group(1)}" if found else "?"
        if purpose_of(messages) == "plan":  # each step's prompt names the episode its goal named
            return "".join(json.dumps({"id": f"s{i}", "tool": "llm", "args": {"prompt": f"Repeat: {marker}"}}) + "\n"
                           for i in range(3))
        return goal_replies(3)(messages, rng) if purpose_of(messages) != "llm" else marker

    toy = ToyPolicyServer(replies, delay=0.05)
    keys: list[str] = []
    async with stack(toy) as (gateway, engine):
        opened = gateway.open_session

        def spy(name: str, **kw: Any) -> Any:
            session = opened(name, **kw)
            keys.append(session.key)
            return session

        gateway.open_session = spy  # type: ignore[method-assign]
        async with GoalRollouts(gateway, engine, episodes_from=goal, episodes=4, concurrency=4) as rollouts:
            episodes = await collect(rollouts, 4)
        # a session's key opens no other session
        async with httpx.AsyncClient() as http:
            other = await http.post(f"{gateway.base_url}/sessions/nobody/v1/chat/completions", json={"messages": []},
                                    headers={"Authorization": f"Bearer {keys[0]}"})
    assert other.status_code == 404
    assert toy.max_in_flight >= 2  # episodes ran at once (how many overlap depends on the machine)
    assert len(set(keys)) == 4
    by_episode = {t.episode: t for t in episodes}
    assert sorted(by_episode) == [0, 1, 2, 3]
    for number, trajectory in by_episode.items():
        samples = trajectory.samples
        assert len(samples) == 5
        assert {s.episode for s in samples} == {number}
        assert {s.run for s in samples} == {trajectory.meta["run"]} and len({s.session for s in samples}) == 1
        assert sorted((s.role, s.step) for s in samples if s.role == "step") == [
            ("step", "s0"), ("step", "s1"), ("step", "s2")]
        for sample in samples:
            said = " ".join(str(m.get("content")) for m in sample.messages)
            assert set(re.findall(r"episode \d+", said)) <= {f"episode {number}"}
            if sample.role == "step":
                assert sample.text == f"episode {number}"
    assert len({t.samples[0].session for t in episodes}) == 4


async def test_the_reward_hook_shares_a_reward_or_gives_one_per_call_sync_or_async() -> None:
    def shared(outcome: EpisodeOutcome) -> float:
        return 0.5 if outcome.status == "succeeded" else -1.0

    async def per_call(outcome: EpisodeOutcome) -> list[float]:
        await asyncio.sleep(0)
        return [1.0 if s.text == "blue" else 0.0 for s in outcome.samples]

    for hook, expect in ((shared, "shared"), (per_call, "per call")):
        toy = ToyPolicyServer(goal_replies(3), seed=3)
        async with stack(toy) as (gateway, engine), GoalRollouts(
                gateway, engine, episodes_from=goal, episodes=2, concurrency=2, reward=hook) as rollouts:
            episodes = await collect(rollouts, 2)
        for trajectory in episodes:
            rewards = [s.reward for s in trajectory.samples]
            if expect == "shared":
                assert rewards == [0.5] * 5 and trajectory.reward == 0.5
            else:
                assert rewards == [1.0 if s.text == "blue" else 0.0 for s in trajectory.samples]
                assert trajectory.reward == sum(r for r in rewards if r is not None)


async def test_a_reward_hook_giving_the_wrong_number_of_rewards_is_an_error_naming_the_episode() -> None:
    toy = ToyPolicyServer(goal_replies(3))
    async with stack(toy) as (gateway, engine), GoalRollouts(
            gateway, engine, episodes_from=goal, episodes=1, reward=lambda o: [1.0, 2.0]) as rollouts:
        with pytest.raises(Exception, match="episode 0: the reward hook gave 2 rewards for 5 model calls"):
            await collect(rollouts, 1)


@pytest.mark.parametrize("on_stale", ["partial", "drop"])
async def test_a_policy_update_mid_episode_resamples_or_drops_calls_outside_the_bound(on_stale: Any) -> None:
    """k = 0: once the planner's call (v0) is answered and the steps' calls are in flight, the policy moves to v1.
    partial: the steps' calls are issued again on v1, the planner's sample stays as context (not trainable);
    drop: the episode is discarded and a fresh one delivered on v1."""
    steps_asked = asyncio.Event()
    base = goal_replies(3)

    def replies(messages: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
        if purpose_of(messages) == "llm":
            steps_asked.set()
        return base(messages, rng)

    toy = ToyPolicyServer(replies, delay=0.2)
    async with stack(toy) as (gateway, engine), GoalRollouts(
            gateway, engine, episodes_from=goal, episodes=1, concurrency=1, max_staleness=0,
            on_stale=on_stale) as rollouts:
        async def update() -> None:
            await steps_asked.wait()
            await rollouts.update_policy(1)

        updater = asyncio.create_task(update())
        [episode] = await collect(rollouts, 1)
        await updater
    assert all(s.policy_version == 1 for s in samples_of([episode]))  # every trainable call within the bound
    if on_stale == "partial":
        assert episode.episode == 0 and len(episode.samples) == 5
        planner, *rest = episode.samples
        assert planner.policy_version == 0 and not planner.trainable
        steps = [s for s in rest if s.role == "step"]
        assert len(steps) == 3 and all(s.resampled == 1 and s.trainable for s in steps)
        assert rollouts.resampled == 3 and episode.interruptions
    else:
        assert episode.episode == 1  # episode 0 was dropped, a fresh one ran on v1
        assert rollouts.stats.dropped_in_flight == 1
        assert all(s.policy_version == 1 and s.trainable for s in episode.samples)


async def test_an_unmodified_openai_client_on_a_session_is_recorded_as_role_other_and_a_wrong_key_is_refused() -> None:
    toy = ToyPolicyServer(lambda messages, rng: "hello there", version_header=True)
    toy.version = 7
    async with stack(toy) as (gateway, _engine):
        session = gateway.open_session("agent", episode=3)
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key)
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        chunks = [c async for c in await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True})]
        wrong = openai.AsyncOpenAI(base_url=session.base_url, api_key="not-the-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        await client.close()
        await wrong.close()
        samples = gateway.close_session("agent")
    assert reply.choices[0].message.content == "hello there"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len("hello there")
    assert len(samples) == 2
    for sample in samples:
        assert sample.role == "other" and sample.run is None and sample.step is None and sample.episode == 3
        assert sample.policy_version == 7  # from the server's X-Policy-Version header
        assert decode(sample.completion_token_ids or ()) == "hello there"


async def test_a_dialect_without_ids_says_so_in_the_sample_instead_of_retokenising() -> None:
    toy = ToyPolicyServer(lambda messages, rng: "plain")
    async with stack(toy, dialect="openai") as (gateway, _engine):
        session = gateway.open_session("s", episode=0)
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{session.base_url}/chat/completions",
                                     json={"model": "p", "messages": [{"role": "user", "content": "x"}]},
                                     headers={"Authorization": f"Bearer {session.key}", "X-Policy-Version": "4"})
        [sample] = gateway.close_session("s")
    assert answer.status_code == 200 and answer.headers["x-policy-version"] == "4"
    assert sample.prompt_token_ids is None and sample.completion_token_ids is None
    assert sample.token_ids_missing == "the 'openai' dialect returns no token ids"
    assert sample.logprobs is not None and len(sample.logprobs) == len("plain")  # logprobs still recorded
    assert sample.policy_version == 4  # the request's version
    assert not toy.bodies[0].get("return_token_ids")


@pytest.mark.parametrize(("max_staleness", "on_stale"), [(0, "partial"), (1, "drop"), (2, "partial")])
async def test_no_delivered_trainable_call_is_older_than_the_bound_across_updates(max_staleness: int,
                                                                                  on_stale: Any) -> None:
    """Goal-run episodes under a policy that moves after every batch (and, via the server's header, mid-call):
    every trainable sample of every batch is within ``max_staleness`` of the version at delivery."""
    toy = ToyPolicyServer(goal_replies(3), delay=0.01, seconds_per_token=0.0002, version_header=True)
    seen: list[tuple[int, int, int]] = []
    async with stack(toy) as (gateway, engine), GoalRollouts(
            gateway, engine, episodes_from=goal, episodes=8, concurrency=4, max_staleness=max_staleness,
            on_stale=on_stale) as rollouts:
        async for batch in rollouts.batches(size=2):
            seen += [(batch.version, s.policy_version, int(s.trainable)) for t in batch for s in t.samples]
            toy.version = await rollouts.update_policy()
    assert len({v for v, _, _ in seen}) >= 3  # the policy moved while episodes ran
    assert all(delivered - served <= max_staleness for delivered, served, trainable in seen if trainable)
    assert sum(trainable for _, _, trainable in seen) > 0


async def test_a_goal_planned_by_a_fixed_planner_samples_only_the_policys_step_calls(tmp_path: Path) -> None:
    """EpisodeSpec(planner=...): a scripted planner plans and joins, the three parallel llm steps call the policy
    through the session; the samples are the policy's three calls, the planner's never reach the gateway."""
    script = tmp_path / "planner.yaml"
    script.write_text(yaml.safe_dump({"plan": [{"id": f"s{i}", "tool": "llm", "args": {"prompt": f"Colour {i}?"}}
                                               for i in range(3)], "answer": "named"}), encoding="utf-8")
    toy = ToyPolicyServer(lambda messages, rng: "blue", delay=0.2)
    async with resolve_model(f"scripted:{script}") as planner, stack(toy) as (gateway, engine), GoalRollouts(
            gateway, engine, episodes_from=lambda s: EpisodeSpec(goal="Name colours.", planner=planner,
                                                                 budget_tokens=50_000),
            episodes=1) as rollouts:
        [episode] = await collect(rollouts, 1)
    assert episode.meta["status"] == "succeeded" and episode.meta["answer"] == "named"
    assert sorted((s.role, s.step, s.text) for s in episode.samples) == [
        ("step", "s0", "blue"), ("step", "s1", "blue"), ("step", "s2", "blue")]
    assert toy.calls == 3 and toy.max_in_flight == 3
