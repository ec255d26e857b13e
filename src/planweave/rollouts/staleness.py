"""The rollout decisions, pure: what a policy update does to an in-flight episode, which finished trajectories may
still be delivered, when production pauses for a lagging consumer, and the order batches are taken in.

Staleness of a trajectory at delivery is ``current version - the oldest policy version among its trainable turns``;
the bound ``max_staleness = k`` says it never exceeds ``k``. :class:`RolloutEngine` drives these objects; the
property tests in ``tests/rollouts/test_staleness.py`` check them directly and from delivered trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planweave.rollouts.trajectory import Trajectory

StalePolicy = Literal["partial", "drop"]
"""What happens to an in-flight episode a policy update would push past the bound: ``partial`` interrupts it and
resumes it on the new policy (its finished turns are kept, marked not trainable, each tagged with its version);
``drop`` discards it (its slot starts a fresh episode)."""

UpdateAction = Literal["continue", "interrupt", "drop"]


@dataclass(frozen=True, slots=True)
class StalenessBound:
    """``max_staleness`` versions, and the policy for episodes that would exceed it."""

    max_staleness: int
    on_stale: StalePolicy = "partial"

    def __post_init__(self) -> None:
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be a whole number (0 or more), got {self.max_staleness!r}")
        if self.on_stale not in ("partial", "drop"):
            raise ValueError(f"on_stale must be 'partial' or 'drop', got {self.on_stale!r}")

    def within(self, oldest: int | None, current: int) -> bool:
        """Whether turns as old as ``oldest`` (None: no turn yet) are within the bound at version ``current``."""
        return oldest is None or current - oldest <= self.max_staleness

    def on_update(self, oldest: int | None, current: int) -> UpdateAction:
        """What the update to ``current`` does to an in-flight episode whose oldest trainable turn (or call in
        flight) was served by ``oldest``: it continues while within the bound, else the chosen policy."""
        if self.within(oldest, current):
            return "continue"
        return "interrupt" if self.on_stale == "partial" else "drop"

    def deliverable(self, trajectory: Trajectory, current: int) -> bool:
        """Whether a finished trajectory may still be delivered at version ``current`` (a finished one that fell
        out of the bound waiting for the consumer cannot be resumed: it is dropped)."""
        return self.within(trajectory.oldest_trainable, current)


@dataclass(frozen=True, slots=True)
class Backpressure:
    """Production pauses while the consumer lags: no new episode starts while ``max_lag_batches`` batches or more
    of finished trajectories wait for it. Episodes in flight always finish, so long ones never stall a batch."""

    max_lag_batches: int = 2

    def __post_init__(self) -> None:
        if self.max_lag_batches < 1:
            raise ValueError(f"max_lag_batches must be at least 1, got {self.max_lag_batches}")

    def may_start(self, waiting: int, batch_size: int) -> bool:
        """Whether a new episode may start with ``waiting`` finished trajectories not yet taken by the consumer."""
        return waiting < self.max_lag_batches * batch_size


def take_batch(ready: Sequence[Trajectory], size: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """The next batch of ``size`` (oldest policy first, then in the order they finished) and what remains."""
    order = sorted(range(len(ready)), key=lambda i: (_oldest(ready[i]), i))
    chosen = set(order[:size])
    return [ready[i] for i in order[:size]], [t for i, t in enumerate(ready) if i not in chosen]


def _oldest(trajectory: Trajectory) -> int:
    oldest = trajectory.oldest_trainable
    return -1 if oldest is None else oldest
