"""Agent RL rollouts: episodes streamed to a trainer in batches, each model call tagged with its policy version,
under a staleness bound, with backpressure, a durable journal and sinks (docs/rollouts.md)."""

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
    "RolloutEngine",
    "RolloutError",
    "RolloutStats",
    "StalePolicy",
    "StalenessBound",
    "StepResult",
    "Trajectory",
    "TrajectoryError",
    "Turn",
    "take_batch",
]
