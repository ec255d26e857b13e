"""A control run's events (``planweave.control``): their kinds and payloads, declared here, not in the engine's.

A control loop journals its run on the same journals as plan runs (any kind string is stored), under a run id of its
own and with no plan; none of these events is a plan run's, and the engine's fold has no handler for them (a plan
run's readers see a run whose first event is not ``run_created`` and say it cannot be read as a plan run). The kind
strings are the ones the engine's ``EventKind`` listed before they moved here, so journals written then read the
same (tests/control/test_events.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

ControlKind = Literal[
    "control_started",  # data: config, tick, resumed (a control loop began or resumed at tick)
    "control_chunk",  # data: chunk, actions, observed_tick, observed_at, start_tick, arrived_tick, dropped, kept_from
    "control_chunk_refused",  # data: chunk, age_s, max_age_s, tick (a chunk older than the bound)
    "control_hold",  # data: tick, reason (no valid action left: the safe action is held)
    "control_tick_missed",  # data: tick, due, lateness_s (a tick whose time passed before it could run)
    "control_checkpoint",  # data: tick, at, state (the environment's snapshot), counters
    "control_finished",  # data: status, ticks, report
]


class ControlStartedData(TypedDict):
    config: dict[str, Any]
    tick: int
    resumed: bool


class ControlChunkData(TypedDict):
    chunk: int
    actions: list[Any]
    observed_tick: int
    observed_at: float
    start_tick: int
    arrived_tick: int
    arrived_at: float
    dropped: int
    kept_from: int  # the tick the aligned chunk starts at


class ControlChunkRefusedData(TypedDict):
    chunk: int
    age_s: float
    max_age_s: float
    tick: int


class ControlHoldData(TypedDict):
    tick: int
    reason: str


class ControlTickMissedData(TypedDict):
    tick: int
    due: float
    lateness_s: float


class ControlCheckpointData(TypedDict):
    tick: int
    at: float
    state: Any
    counters: dict[str, Any]


class ControlFinishedData(TypedDict):
    status: str
    ticks: int
    report: dict[str, Any]


# The payload type of every kind of a control run's events.
CONTROL_PAYLOADS: Mapping[ControlKind, type] = {
    "control_started": ControlStartedData,
    "control_chunk": ControlChunkData,
    "control_chunk_refused": ControlChunkRefusedData,
    "control_hold": ControlHoldData,
    "control_tick_missed": ControlTickMissedData,
    "control_checkpoint": ControlCheckpointData,
    "control_finished": ControlFinishedData,
}
