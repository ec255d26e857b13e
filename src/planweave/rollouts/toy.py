"""Small deterministic environments for the example, the benchmark and the tests (and a CLI config's ``env:``).

:class:`Corridor` is a multi-step tool environment: the agent calls ``left``, ``right`` or ``look`` to reach a goal
it only sees by looking. :class:`Countdown` has seeded, long-tailed episode lengths (a Pareto draw): any action
advances it, its reward says whether the action was ``ok``.
"""

from __future__ import annotations

import random
import re

from planweave.rollouts.engine import StepResult

_POSITION = re.compile(r"position (\d+) of (\d+)")


class Corridor:
    """Cells 0..length-1; the agent starts at 0, the goal is at a seeded cell ≥ 1. Tools: ``left``, ``right``,
    ``look`` (tells whether the goal is ahead or behind). Reward 1 on reaching the goal, -0.05 per step."""

    def __init__(self, seed: int, length: int = 6) -> None:
        self.length = length
        self.goal = random.Random(seed).randrange(1, length)
        self.position = 0

    def _describe(self, note: str) -> str:
        return f"position {self.position} of {self.length}. {note} tools: left, right, look"

    async def reset(self) -> str:
        self.position = 0
        return self._describe("find the goal.")

    async def step(self, action: str) -> StepResult:
        word = action.strip().lower()
        if word == "look":
            side = "ahead" if self.goal > self.position else "behind"
            return StepResult(self._describe(f"the goal is {side}."), -0.05)
        if word in ("left", "right"):
            self.position = max(0, min(self.length - 1, self.position + (1 if word == "right" else -1)))
        else:
            return StepResult(self._describe(f"unknown tool {action.strip()[:20]!r}."), -0.05)
        if self.position == self.goal:
            return StepResult(self._describe("goal reached!"), 1.0, True)
        return StepResult(self._describe("no goal here."), -0.05)


def corridor_position(observation: str) -> tuple[int, int]:
    """The (position, length) an observation of :class:`Corridor` states."""
    match = _POSITION.search(observation)
    if match is None:
        raise ValueError(f"not a corridor observation: {observation[:60]!r}")
    return int(match.group(1)), int(match.group(2))


def pareto_length(seed: int, *, shape: float = 1.2, cap: int = 40) -> int:
    """A long-tailed episode length in 1..cap drawn from ``seed``: most episodes are short, a few are very long."""
    return min(cap, int(random.Random(seed).paretovariate(shape)))


class Countdown:
    """An episode of :func:`pareto_length` turns (or ``turns``); reward 1 per ``ok`` action."""

    def __init__(self, seed: int, *, shape: float = 1.2, cap: int = 40, turns: int | None = None) -> None:
        self.turns = pareto_length(seed, shape=shape, cap=cap) if turns is None else turns
        self.left = self.turns

    async def reset(self) -> str:
        self.left = self.turns
        return f"{self.left} turns left"

    async def step(self, action: str) -> StepResult:
        self.left -= 1
        return StepResult(f"{self.left} turns left", 1.0 if action.strip() == "ok" else 0.0, self.left <= 0)
