"""Train a small policy for a few steps from goal-run episodes' exported samples (issue 31).

    python -m examples.rollouts.goal_train --steps 5                   # the toy policy server samples
    python -m examples.rollouts.goal_train --steps 3 --sampler local   # llama.cpp (Gemma 3 270M) samples

Each episode is a planweave run through the rollout gateway: with ``--sampler toy`` a goal run (the planner writes
three parallel ``llm`` steps, each names a colour, the joiner answers) on the toy vLLM-dialect server; with
``--sampler local`` a plan run of three parallel ``llm`` steps on the llama.cpp server (a 270M base model writes no
usable plan; its ids come from the ``llama-cpp-python`` dialect with the ``gemma`` chat format). The reward hook
gives each step's call 1 when its reply starts with "blue" (toy) or names a rainbow colour (llama.cpp), else 0
(planner and joiner calls 0).

The sampler is never trained (it stays a sampler); the trained policy is a numpy softmax over the first completion
token of a step's reply, learnt by REINFORCE with the batch's mean reward as baseline (GRPO-style) from the samples
exported as TRL ``rollout_func`` rows (``to_trl``). Each step prints the batch's samples, its mean step reward and
the trained policy's probability of the rewarded first token, which rises from step to step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from planweave.api import open_engine
from planweave.extras import require
from planweave.rollouts.export import to_trl
from planweave.rollouts.gateway import Dialect, Gateway
from planweave.rollouts.goals import EpisodeOutcome, EpisodeSpec, GoalRollouts, samples_of
from planweave.rollouts.toy_policy import ToyPolicyServer, goal_replies

PROMPT = "Name one colour of the rainbow, in one word."
RAINBOW = ("red", "orange", "yellow", "green", "blue", "indigo", "violet")


class FirstTokenPolicy:
    """``softmax(theta)`` over the first completion tokens seen so far (a token first seen gets logit 0)."""

    def __init__(self, lr: float = 3.0) -> None:
        require("rollouts-example", "the rollouts example")
        import numpy as np

        self.np = np
        self.ids: list[int] = []
        self.theta = np.zeros(0)
        self.lr = lr

    def _index(self, token: int) -> int:
        if token not in self.ids:
            self.ids.append(token)
            self.theta = self.np.append(self.theta, 0.0)
        return self.ids.index(token)

    def probs(self) -> Any:
        z = self.theta - self.theta.max()
        e = self.np.exp(z)
        return e / e.sum()

    def prob_of(self, token: int | None) -> float:
        return 0.0 if token is None or token not in self.ids else float(self.probs()[self.ids.index(token)])

    def update(self, rows: dict[str, list[Any]]) -> float:
        """One REINFORCE step on TRL rows of step calls; returns their mean reward."""
        firsts = [self._index(ids[0]) for ids in rows["completion_ids"]]
        rewards = self.np.array(rows["env_reward"], dtype=float)
        advantages = rewards - rewards.mean()
        p = self.probs()
        grad = self.np.zeros_like(self.theta)
        for index, advantage in zip(firsts, advantages, strict=True):
            one_hot = self.np.zeros_like(self.theta)
            one_hot[index] = 1.0
            grad += advantage * (one_hot - p)  # d log softmax(theta)[index] / d theta
        self.theta += self.lr * grad / max(len(firsts), 1)
        return float(rewards.mean())


@contextlib.asynccontextmanager
async def sampler(kind: str) -> AsyncIterator[tuple[str, Dialect]]:
    """The policy server's /v1 URL and its dialect."""
    if kind == "toy":
        async with ToyPolicyServer(goal_replies(3, words=("blue", "red", "green", "amber")), seed=7) as url:
            yield url, "vllm"
        return
    from planweave.models.local import local_server

    async with local_server() as url:  # its server computes logits for all tokens by default: logprobs work
        yield url, "llama-cpp-python"


def episode_for(kind: str) -> Any:
    def episode(seed: int) -> EpisodeSpec:
        if kind == "toy":
            return EpisodeSpec(goal=f"Name three colours (episode {seed}).", budget_tokens=100_000, deadline=60)
        steps = [{"id": f"s{i}", "tool": "llm", "args": {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0}}
                 for i in range(3)]
        return EpisodeSpec(plan={"name": f"colours-{seed}", "steps": steps}, model="local",
                           budget_tokens=100_000, deadline=120)

    return episode


async def main(steps: int, batch: int, kind: str) -> list[float]:
    policy = FirstTokenPolicy()
    target: list[int | None] = [None]

    def good(text: str) -> bool:  # the toy: a reply starting "blue"; llama.cpp: one naming a rainbow colour
        said = text.strip().lower()
        return said.startswith("blue") if kind == "toy" else any(c in said for c in RAINBOW)

    def reward(outcome: EpisodeOutcome) -> list[float]:
        return [1.0 if s.role == "step" and good(s.text) else 0.0 for s in outcome.samples]

    history = []
    async with sampler(kind) as (url, dialect), \
            Gateway(url, dialect=dialect, chat_format="gemma" if kind == "local" else None) as gateway, \
            open_engine("memory://") as engine, \
            GoalRollouts(gateway, engine, episodes_from=episode_for(kind), reward=reward, episodes=steps * batch,
                         concurrency=batch if kind == "toy" else 1, max_staleness=1) as rollouts:
        async for delivered in rollouts.batches(size=batch):
            calls = [s for s in samples_of(delivered) if s.role == "step"]
            rows = to_trl(calls, skip_missing=True)
            for ids, r in zip(rows["completion_ids"], rows["env_reward"], strict=True):
                if r > 0:
                    target[0] = ids[0]
            before = policy.prob_of(target[0])
            mean = policy.update(rows) if rows["completion_ids"] else 0.0
            history.append(policy.prob_of(target[0]))
            print(f"step {delivered.number}: {len(samples_of(delivered))} samples ({len(rows['prompt_ids'])} step "
                  f"calls with ids), mean step reward {mean:.2f}, policy version {rollouts.version}, "
                  f"P(rewarded first token) {before:.2f} -> {history[-1]:.2f}", flush=True)
            await rollouts.update_policy()
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (batches)")
    parser.add_argument("--batch", type=int, default=4, help="episodes per batch")
    parser.add_argument("--sampler", choices=("toy", "local"), default="toy")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.batch, args.sampler))
