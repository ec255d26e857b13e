"""What an episode produces: each model call tagged with the policy version that served it, each observation, and
the score — complete and self-describing, as plain JSON (:meth:`Trajectory.to_json`, :meth:`Trajectory.from_json`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planweave.rollouts.samples import Sample, TrajectoryError

__all__ = ["Interruption", "Sample", "Trajectory", "TrajectoryError", "Turn"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One step of an episode: the model call that chose the action and what the environment answered.

    ``version`` is the policy version that served the call; ``logprobs`` each completion token's top logprobs
    (best first) when the endpoint returned them. ``trainable`` is False for the kept part of an episode that was
    interrupted and resumed on a newer policy once that part fell outside the staleness bound (the new policy's
    calls continue from it; see docs/rollouts.md).
    """

    index: int
    prompt: tuple[tuple[str, str], ...]  # (role, content) of every message sent
    action: str
    version: int
    observation: str
    reward: float
    done: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[tuple[float, ...], ...] | None = None
    trainable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "prompt": [list(m) for m in self.prompt], "action": self.action,
                "version": self.version, "observation": self.observation, "reward": self.reward, "done": self.done,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "logprobs": None if self.logprobs is None else [list(t) for t in self.logprobs],
                "trainable": self.trainable}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "turn") -> Turn:
        try:
            lp = obj.get("logprobs")
            return cls(index=int(obj["index"]), prompt=tuple((str(r), str(c)) for r, c in obj["prompt"]),
                       action=str(obj["action"]), version=int(obj["version"]), observation=str(obj["observation"]),
                       reward=float(obj["reward"]), done=bool(obj["done"]),
                       prompt_tokens=int(obj.get("prompt_tokens", 0)),
                       completion_tokens=int(obj.get("completion_tokens", 0)),
                       logprobs=None if lp is None else tuple(tuple(float(x) for x in t) for t in lp),
                       trainable=bool(obj.get("trainable", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise TrajectoryError(f"{where}: not a turn ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class Interruption:
    """An episode interrupted by a policy update and resumed on the new policy before turn ``at``."""

    at: int
    from_version: int
    to_version: int


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A finished episode: its id and seed, the first observation, every turn, the score and its interruptions.

    A goal-run episode (:mod:`planweave.rollouts.goals`) has no turns but ``samples``: one per model call (planner,
    joiner, ``llm`` steps), each with its exact tokens and policy version; ``observation`` is then its goal."""

    episode: int
    seed: int
    observation: str  # what reset() returned
    turns: tuple[Turn, ...]
    reward: float
    interruptions: tuple[Interruption, ...] = ()
    resumed: bool = False  # journaled turns were replayed after the rollout process restarted
    meta: Mapping[str, Any] = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()

    @property
    def versions(self) -> tuple[int, ...]:
        """The policy version of each turn (of each sample, for a goal-run episode)."""
        return tuple(t.version for t in self.turns) + tuple(s.policy_version for s in self.samples)

    @property
    def oldest_trainable(self) -> int | None:
        """The oldest policy version among the trainable turns and samples (None: none)."""
        versions = [t.version for t in self.turns if t.trainable]
        versions += [s.policy_version for s in self.samples if s.trainable]
        return min(versions) if versions else None

    def staleness(self, current: int) -> int:
        """How many versions older than ``current`` the oldest trainable turn is (0 for no turn)."""
        oldest = self.oldest_trainable
        return 0 if oldest is None else current - oldest

    def to_json(self) -> dict[str, Any]:
        out = {"episode": self.episode, "seed": self.seed, "observation": self.observation,
               "turns": [t.to_json() for t in self.turns], "reward": self.reward,
               "interruptions": [[i.at, i.from_version, i.to_version] for i in self.interruptions],
               "resumed": self.resumed, "meta": dict(self.meta)}
        if self.samples:
            out["samples"] = [s.to_json() for s in self.samples]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "trajectory") -> Trajectory:
        if not isinstance(obj, Mapping):
            raise TrajectoryError(f"{where}: not a JSON object")
        try:
            turns = tuple(Turn.from_json(t, f"{where}.turns[{i}]") for i, t in enumerate(obj["turns"]))
            return cls(episode=int(obj["episode"]), seed=int(obj["seed"]), observation=str(obj["observation"]),
                       turns=turns, reward=float(obj["reward"]),
                       interruptions=tuple(Interruption(int(a), int(f), int(t)) for a, f, t in
                                           obj.get("interruptions", ())),
                       resumed=bool(obj.get("resumed", False)), meta=dict(obj.get("meta") or {}),
                       samples=tuple(Sample.from_json(x, f"{where}.samples[{i}]")
                                     for i, x in enumerate(obj.get("samples") or ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise TrajectoryError(f"{where}: missing or bad field ({type(exc).__name__}: {exc})") from None
