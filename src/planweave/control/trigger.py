"""When to ask the policy for the next chunk, and the latency estimate rollforward uses (pure, no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class InferenceTrigger:
    """Ask for a chunk ``every`` ticks, when fewer than ``below`` actions remain, or on a monitor's event.

    At most one inference is in flight: a trigger while one runs waits for it, except a monitor's event, which
    replaces it (its chunk was inferred from a state the event has made stale). With no plan at all, ask at once.
    """

    every: int | None = None
    below: int | None = None

    def __post_init__(self) -> None:
        if self.every is None and self.below is None:
            raise ValueError("an inference trigger needs every=K ticks or below=M remaining actions")
        for name, value in (("every", self.every), ("below", self.below)):
            if value is not None and value < 1:
                raise ValueError(f"inference trigger {name}={value}: must be at least 1")

    def due(self, tick: int, remaining: int, last_request_tick: int | None, in_flight: bool) -> bool:
        """Whether to request a chunk at ``tick`` (``remaining`` actions are planned from it on)."""
        if in_flight:
            return False
        if last_request_tick is None or remaining == 0:
            return True
        if self.every is not None and tick - last_request_tick >= self.every:
            return True
        return self.below is not None and remaining < self.below


class LatencyEstimate:
    """The expected inference latency in ticks: the last one observed, or the hint before any was."""

    def __init__(self, hint_s: float, dt: float) -> None:
        if hint_s < 0:
            raise ValueError(f"latency hint {hint_s} s: must not be negative")
        self.dt = dt
        self.seconds = hint_s

    def observe(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def ticks(self) -> int:
        # A chunk that arrives during tick k is first used at tick k+1: round up, with a little slack for float error.
        return max(0, math.ceil(self.seconds / self.dt - 1e-9))
