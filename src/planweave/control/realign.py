"""Chunks of future actions and how one computed for a past state is realigned to the present (pure, no I/O).

A chunk is a list of actions, the first meant for tick ``start_tick``. It was inferred from the observation taken
at ``observed_tick``; by the time it arrives (``arrived_tick``) some of its ticks may have passed. A realignment
strategy has two halves: :meth:`Realign.condition` decides, when a chunk is requested, which state the policy is
conditioned on and which tick its first action is for; :meth:`Realign.align` decides, when it arrives, which of its
actions still apply and from which tick. The runtime (``control/loop.py``) drives them; this module only decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Action = Any
Observation = Any
RealignName = Literal["drop_expired", "rollforward", "nearest"]


@dataclass(frozen=True)
class Chunk:
    """A chunk of actions as it arrived: ``actions[i]`` is for tick ``start_tick + i``."""

    id: int
    actions: tuple[Action, ...]
    start_tick: int
    observed_tick: int
    observed_at: float
    arrived_tick: int
    arrived_at: float


@dataclass(frozen=True)
class Aligned:
    """What remains of a chunk after realignment: ``actions[i]`` runs at tick ``start_tick + i``; ``dropped`` cut."""

    actions: tuple[Action, ...]
    start_tick: int
    dropped: int


class Realign(Protocol):
    """A realignment strategy (see the module docstring)."""

    name: str

    def condition(self, obs: Observation, tick: int, pending: Sequence[Action],
                  latency_ticks: int) -> tuple[Observation, int]:
        """The state to infer from and the tick the chunk's first action is for, given the ``pending`` actions."""
        ...

    def align(self, chunk: Chunk, now_tick: int, obs: Observation) -> Aligned:
        """The part of ``chunk`` that still applies at ``now_tick`` (``obs`` is the current observation)."""
        ...


def drop_expired(chunk: Chunk, now_tick: int) -> Aligned:
    """Discard the actions whose tick has passed; a chunk meant for the future keeps its start."""
    expired = min(len(chunk.actions), max(0, now_tick - chunk.start_tick))
    return Aligned(chunk.actions[expired:], max(now_tick, chunk.start_tick), expired)


class DropExpired:
    """Infer from the present state; on arrival, discard the actions whose time has passed."""

    name = "drop_expired"

    def condition(self, obs: Observation, tick: int, pending: Sequence[Action],
                  latency_ticks: int) -> tuple[Observation, int]:
        return obs, tick

    def align(self, chunk: Chunk, now_tick: int, obs: Observation) -> Aligned:
        return drop_expired(chunk, now_tick)


class RollForward:
    """VLASH: predict the state at the expected arrival by rolling the present forward with the actions that will
    run meanwhile (``model(obs, action) -> obs``, one tick each), and infer the chunk for that tick.

    When the latency estimate was short, the actions already past are dropped on arrival, as ``drop_expired`` does;
    when it was long, the chunk starts later and the current actions run until then.
    """

    name = "rollforward"

    def __init__(self, model: Callable[[Observation, Action], Observation]) -> None:
        self.model = model

    def condition(self, obs: Observation, tick: int, pending: Sequence[Action],
                  latency_ticks: int) -> tuple[Observation, int]:
        if latency_ticks > len(pending):
            raise ValueError(f"rollforward needs {latency_ticks} pending actions to roll forward, got {len(pending)}")
        state = obs
        for action in pending[:latency_ticks]:
            state = self.model(state, action)
        return state, tick + latency_ticks

    def align(self, chunk: Chunk, now_tick: int, obs: Observation) -> Aligned:
        return drop_expired(chunk, now_tick)


class Nearest:
    """Mobile UMI: the actions are waypoints; on arrival, execution resumes after the waypoint nearest the present
    state (``distance(obs, action)``), the waypoints before it are discarded (ties: the earliest)."""

    name = "nearest"

    def __init__(self, distance: Callable[[Observation, Action], float]) -> None:
        self.distance = distance

    def condition(self, obs: Observation, tick: int, pending: Sequence[Action],
                  latency_ticks: int) -> tuple[Observation, int]:
        return obs, tick

    def align(self, chunk: Chunk, now_tick: int, obs: Observation) -> Aligned:
        if not chunk.actions:
            return Aligned((), now_tick, 0)
        distances = [self.distance(obs, action) for action in chunk.actions]
        nearest = min(range(len(distances)), key=distances.__getitem__)
        # The nearest waypoint is where the robot is: head for the next one (the last one is kept as the goal).
        keep = min(nearest + 1, len(chunk.actions) - 1)
        return Aligned(chunk.actions[keep:], now_tick, keep)


class CustomRealign:
    """A user function ``align(chunk, now_tick, obs) -> Aligned``; the policy infers from the present state."""

    def __init__(self, align: Callable[[Chunk, int, Observation], Aligned], name: str = "custom") -> None:
        self._align = align
        self.name = name

    def condition(self, obs: Observation, tick: int, pending: Sequence[Action],
                  latency_ticks: int) -> tuple[Observation, int]:
        return obs, tick

    def align(self, chunk: Chunk, now_tick: int, obs: Observation) -> Aligned:
        aligned = self._align(chunk, now_tick, obs)
        if not isinstance(aligned, Aligned):
            raise TypeError(f"realign function '{self.name}' returned {type(aligned).__name__}, not an Aligned")
        return aligned


def blend(old: Sequence[Action], new: Sequence[Action], steps: int) -> tuple[Action, ...]:
    """``new`` with its first ``steps`` actions cross-faded from ``old`` (numeric vectors or numbers, linearly).

    Action ``i < steps`` is ``w*new[i] + (1-w)*old[i]`` with ``w = (i+1)/(steps+1)``; where ``old`` has no action
    for that tick, the new one is kept as it is.
    """
    out: list[Action] = []
    for i, action in enumerate(new):
        if i >= steps or i >= len(old):
            out.append(action)
            continue
        w = (i + 1) / (steps + 1)
        if isinstance(action, int | float):
            out.append(w * action + (1 - w) * old[i])
        else:
            out.append(tuple(w * a + (1 - w) * b for a, b in zip(action, old[i], strict=True)))
    return tuple(out)


class ActionPlan:
    """The actions the executor will run, by tick, each with the chunk it came from: what chunks are spliced into."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.sources: list[tuple[int, float]] = []  # (chunk id, the time of the observation it was inferred from)
        self.start_tick = 0

    def action_at(self, tick: int) -> tuple[Action, int, float] | None:
        """The action planned for ``tick`` with its chunk and observation time, or None when none is."""
        i = tick - self.start_tick
        if 0 <= i < len(self.actions):
            return self.actions[i], *self.sources[i]
        return None

    def pending(self, tick: int) -> list[Action]:
        """The actions planned from ``tick`` on."""
        return self.actions[max(0, tick - self.start_tick):]

    def remaining(self, tick: int) -> int:
        return len(self.pending(tick))

    def clear(self) -> None:
        self.actions, self.sources = [], []

    def splice(self, aligned: Aligned, chunk: Chunk, *, blend_steps: int = 0) -> int:
        """Replace the plan from ``aligned.start_tick`` on with the aligned chunk; returns the actions superseded.

        The current actions before the new chunk's start are kept (a chunk meant for a later tick waits for it).
        """
        cut = max(0, min(len(self.actions), aligned.start_tick - self.start_tick))
        if aligned.start_tick > self.start_tick + len(self.actions):  # a gap before the new chunk: forget the old
            self.actions, self.sources, cut = [], [], 0
        superseded = self.actions[cut:]
        new = aligned.actions if not blend_steps else blend(superseded, aligned.actions, blend_steps)
        if not self.actions or cut == 0:
            self.start_tick = aligned.start_tick
        self.actions = [*self.actions[:cut], *new]
        self.sources = [*self.sources[:cut], *[(chunk.id, chunk.observed_at)] * len(new)]
        return len(superseded)


def realign_by_name(name: RealignName, *, model: Callable[[Observation, Action], Observation] | None = None,
                    distance: Callable[[Observation, Action], float] | None = None) -> Realign:
    """The strategy called ``name``; ``rollforward`` needs ``model``, ``nearest`` needs ``distance``."""
    if name == "drop_expired":
        return DropExpired()
    if name == "rollforward":
        if model is None:
            raise ValueError("realign='rollforward' needs a model (model=lambda obs, action: next_obs)")
        return RollForward(model)
    if name == "nearest":
        if distance is None:
            raise ValueError("realign='nearest' needs a distance (distance=lambda obs, waypoint: float)")
        return Nearest(distance)
    raise ValueError(f"realign '{name}' is not known: use drop_expired, rollforward, nearest or a function")
