"""An environment for the redaction tests, named by a rollouts config (``tests.rollouts.leaky:Leaky``): three turns
whose observations quote this process's ``OPENAI_API_KEY``; an action is right (reward 1) when it says the key, so
an action the journal kept redacted replays as a wrong one."""

from __future__ import annotations

import os

from planweave.rollouts import StepResult


class Leaky:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.left = 3

    async def reset(self) -> str:
        self.left = 3
        return f"episode {self.seed}: 3 turns left (key {os.environ['OPENAI_API_KEY']})"

    async def step(self, action: str) -> StepResult:
        self.left -= 1
        key = os.environ["OPENAI_API_KEY"]
        right = key in action
        return StepResult(f"{'right' if right else 'wrong'}; {self.left} turns left (key {key})", float(right),
                          self.left <= 0)
