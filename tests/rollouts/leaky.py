"""An environment for the redaction tests, named by a rollouts config (``tests.rollouts.leaky:Leaky``): three turns
whose observations quote this process's ``OPENAI_API_KEY`` and the action, so a replayed action that the journal
kept redacted gives another observation."""

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
        return StepResult(f"you said {action!r}; {self.left} turns left (key {os.environ['OPENAI_API_KEY']})", 1.0,
                          self.left <= 0)
