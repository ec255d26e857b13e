"""Agent RL rollouts: episodes streamed to a trainer in batches, each model call tagged with its policy version,
under a staleness bound, with backpressure, a durable journal and sinks; goal-run episodes through the gateway, one
sample per model call with the server's token ids, and exporters to TRL, verl and slime (docs/rollouts.md).

The gateway, goal episodes and exporters load on first use (``planweave.rollouts.gateway``, ``.goals``, ``.export``:
they need the ``server`` extra); the names below are the ones every rollout uses."""

from planweave.rollouts.engine import (
    Batch,
    EnvFactory,
    Environment,
    RewardFunction,
    RolloutEngine,
    RolloutError,
    RolloutStats,
    StepResult,
)
from planweave.rollouts.samples import Role, Sample
from planweave.rollouts.staleness import Backpressure, StalenessBound, StalePolicy, take_batch
from planweave.rollouts.trajectory import Interruption, Trajectory, TrajectoryError, Turn

Episode = Trajectory
"""A finished episode as delivered (the issue's name for it)."""

__all__ = [
    "Backpressure",
    "Batch",
    "EnvFactory",
    "Environment",
    "Episode",
    "Interruption",
    "RewardFunction",
    "Role",
    "RolloutEngine",
    "RolloutError",
    "RolloutStats",
    "Sample",
    "StalePolicy",
    "StalenessBound",
    "StepResult",
    "Trajectory",
    "TrajectoryError",
    "Turn",
    "take_batch",
]
