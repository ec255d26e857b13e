"""A real, small RL loop on a CPU: a numpy softmax policy served over HTTP as an OpenAI-compatible endpoint, the
toy :class:`~planweave.rollouts.toy.Corridor` tool environment, the rollout engine streaming trajectories, and a
REINFORCE update with a group-mean baseline (GRPO-style) that the endpoint serves from the next call on.

    python -m examples.rollouts.reinforce --updates 30 --plot docs/rollouts-reward.png

The policy's state is the note of the last observation (nothing yet / goal ahead / goal behind / other); its
actions the corridor's tools. The endpoint samples an action from ``softmax(W[state])`` and returns it with its
logprob (OpenAI ``logprobs``); each turn of a trajectory carries the policy version that served it.
"""

from __future__ import annotations

import argparse
import asyncio
import math

from planweave.extras import require
from planweave.models.openai import OpenAIChatClient
from planweave.rollouts import RolloutEngine, Trajectory
from planweave.rollouts.toy import Corridor
from planweave.testing import RecordedRequest, ScriptedLLM, Text

ACTIONS = ("left", "right", "look")
STATES = ("start", "ahead", "behind", "other")


def state_of(observation: str) -> int:
    if "goal is ahead" in observation:
        return 1
    if "goal is behind" in observation:
        return 2
    return 0 if "find the goal" in observation or "no goal here" in observation else 3


class SoftmaxPolicy:
    """``W[state, action]`` logits; ``serve`` answers a chat request by sampling, ``update`` is one REINFORCE step."""

    def __init__(self, seed: int = 0, lr: float = 0.5) -> None:
        require("rollouts-example", "the rollouts example")
        import numpy as np

        self.np = np
        self.rng = np.random.default_rng(seed)
        self.weights = np.zeros((len(STATES), len(ACTIONS)))
        self.weights[0] = (1.0, -1.0, 0.0)  # start biased the wrong way: learning has something to do
        self.lr = lr
        self.version = 0

    def probs(self, state: int) -> list[float]:
        z = self.weights[state] - self.weights[state].max()
        e = self.np.exp(z)
        return list(e / e.sum())

    def serve(self, request: RecordedRequest) -> Text:
        state = state_of(request.messages[-1]["content"])
        p = self.probs(state)
        action = int(self.rng.choice(len(ACTIONS), p=p))
        return Text(ACTIONS[action], logprobs=((math.log(p[action]),),))

    def update(self, batch: list[Trajectory]) -> float:
        """REINFORCE with the batch's mean reward as baseline over the trainable turns; returns the mean reward."""
        rewards = [t.reward for t in batch]
        mean = sum(rewards) / len(rewards)
        grad = self.np.zeros_like(self.weights)
        for t in batch:
            advantage = t.reward - mean
            for turn in t.turns:
                if not turn.trainable:
                    continue
                state = state_of(turn.prompt[-1][1])
                onehot = self.np.zeros(len(ACTIONS))
                onehot[ACTIONS.index(turn.action)] = 1.0
                grad[state] += advantage * (onehot - self.np.array(self.probs(state)))
        self.weights += self.lr * grad / len(batch)
        self.version += 1
        return mean


async def train(updates: int, batch_size: int = 16, seed: int = 0) -> list[float]:
    """Run ``updates`` trainer steps; the mean reward of each batch."""
    policy = SoftmaxPolicy(seed)
    server = ScriptedLLM(policy.serve)
    curve: list[float] = []
    async with server as url, OpenAIChatClient("softmax", base_url=url, api_key="example") as client, \
            RolloutEngine(client, lambda s: Corridor(s), max_staleness=2, concurrency=32, max_turns=12, logprobs=1,
                          seed=seed) as rollouts:
        async for batch in rollouts.batches(size=batch_size):
            curve.append(policy.update(list(batch)))
            await rollouts.update_policy(policy.version)
            if len(curve) == updates:
                break
    return curve


def plot(curve: list[float], path: str) -> None:
    require("rollouts-example", "the rollouts example's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3)
    ax.set_xlabel("trainer update")
    ax.set_ylabel("mean episode reward")
    ax.set_title("REINFORCE on planweave rollouts (Corridor)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--plot", default=None, help="Write the reward curve as a PNG here.")
    args = parser.parse_args()
    curve = asyncio.run(train(args.updates, args.batch))
    for i, r in enumerate(curve, start=1):
        print(f"update {i:>3}: mean reward {r:+.3f}")
    if args.plot:
        plot(curve, args.plot)


if __name__ == "__main__":
    main()
