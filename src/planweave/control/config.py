"""A control run described in a YAML file (``planweave control run CONFIG.yaml``): typed, checked, built.

::

    env: point              # point | cartpole (cartpole needs the [control] extra)
    env_options: {seed: 0, duration: 20}
    policy: {latency_ms: 150, jitter_ms: 15, seed: 0}   # the simulated policy of the environment
    rate_hz: 50
    horizon: 32
    execute: 8
    realign: rollforward    # drop_expired | rollforward | nearest (point only)
    mode: async             # async | sync
    max_age_s: 1.0          # optional: refuse older chunks
    max_calls: 2000         # optional
    deadline_s: 60          # optional
    clock: virtual          # virtual (simulated time) | real
    journal: sqlite:///control.db
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from planweave.control.envs import (
    CartPole,
    PointTracking,
    SimulatedPolicy,
    cart_model,
    cart_planner,
    point_model,
    point_planner,
)
from planweave.control.loop import ControlError, ControlLoop, TickRecord

ENVS = ("point", "cartpole")


@dataclass(frozen=True)
class PolicyConfig:
    latency_ms: float = 150.0
    jitter_ms: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class ControlRunConfig:
    """The settings of a control run file (see the module docstring)."""

    env: str = "point"
    env_options: dict[str, Any] = field(default_factory=dict)
    policy: PolicyConfig = PolicyConfig()
    rate_hz: float = 50.0
    horizon: int = 32
    execute: int = 8
    realign: str = "rollforward"
    mode: str = "async"
    max_age_s: float | None = None
    max_calls: int | None = None
    deadline_s: float | None = None
    clock: str = "virtual"
    journal: str | None = None


def load_config(path: Path) -> ControlRunConfig:
    """Read ``path``; raises ControlError naming the file and the field for anything wrong."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ControlError(f"cannot read control config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ControlError(f"control config {path} is not valid YAML: {exc}") from None
    return parse_config(raw if raw is not None else {}, str(path))


def parse_config(raw: Any, where: str) -> ControlRunConfig:
    if not isinstance(raw, dict):
        raise ControlError(f"control config {where}: expected a mapping of settings, got {type(raw).__name__}")
    known = {f.name: f for f in fields(ControlRunConfig)}
    for key in raw:
        if key not in known:
            raise ControlError(f"control config {where}: unknown setting '{key}' (known: {', '.join(known)})")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "policy":
            values[key] = _policy(value, where)
        elif key == "env_options":
            if not isinstance(value, dict):
                raise ControlError(f"control config {where}: 'env_options' must be a mapping")
            values[key] = value
        elif key in ("rate_hz", "horizon", "execute", "max_age_s", "max_calls", "deadline_s"):
            if value is not None:
                _number(value, key, where)
            values[key] = value
        else:
            if value is not None and not isinstance(value, str):
                raise ControlError(f"control config {where}: '{key}' must be a string, got {value!r}")
            values[key] = value
    config = ControlRunConfig(**values)
    if config.env not in ENVS:
        raise ControlError(f"control config {where}: env '{config.env}' is not known (use {' or '.join(ENVS)})")
    if config.clock not in ("virtual", "real"):
        raise ControlError(f"control config {where}: clock '{config.clock}' is not known (use virtual or real)")
    return config


def _policy(value: Any, where: str) -> PolicyConfig:
    if not isinstance(value, dict):
        raise ControlError(f"control config {where}: 'policy' must be a mapping")
    known = {f.name for f in fields(PolicyConfig)}
    for key, item in value.items():
        if key not in known:
            raise ControlError(f"control config {where}: unknown setting 'policy.{key}' "
                               f"(known: {', '.join(sorted(known))})")
        _number(item, f"policy.{key}", where)
    return PolicyConfig(**value)


def _number(value: Any, key: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ControlError(f"control config {where}: '{key}' must be a number, got {value!r}")


def build_loop(config: ControlRunConfig, observer: Any = None) -> tuple[ControlLoop, PointTracking | CartPole]:
    """The loop and its environment as ``config`` describes them (ControlError for bad settings)."""
    dt = 1.0 / config.rate_hz if config.rate_hz > 0 else 0.02
    env: PointTracking | CartPole
    try:
        if config.env == "point":
            env = PointTracking(**config.env_options)
            planner: Any = point_planner
            safe: Any = (0.0, 0.0)

            def model(obs: Any, action: Any) -> Any:
                return point_model(obs, action, dt)

            def distance(obs: Any, waypoint: Any) -> float:  # waypoints here are velocities: pick the closest
                return float(abs(waypoint[0] - obs.tvx) + abs(waypoint[1] - obs.tvy))
        else:
            env = CartPole(**config.env_options)
            planner, safe = cart_planner, 0.0

            def model(obs: Any, action: Any) -> Any:
                return cart_model(obs, action, dt)

            def distance(obs: Any, waypoint: Any) -> float:
                return abs(float(waypoint))
    except TypeError as exc:
        raise ControlError(f"control config: env_options for '{config.env}': {exc}") from None
    p = config.policy
    try:
        policy = SimulatedPolicy(planner, latency_s=p.latency_ms / 1000, jitter_s=p.jitter_ms / 1000, seed=p.seed)
    except ValueError as exc:
        raise ControlError(f"control config: policy: {exc}") from None
    loop = ControlLoop(env=env, policy=policy, rate_hz=config.rate_hz, horizon=int(config.horizon),
                       execute=int(config.execute), realign=config.realign, model=model,  # type: ignore[arg-type]
                       distance=distance, mode=config.mode, safe_action=safe,  # type: ignore[arg-type]
                       max_age_s=config.max_age_s, max_calls=config.max_calls,
                       latency_hint_s=p.latency_ms / 1000, journal=config.journal, observer=observer)
    return loop, env


def live_line(record: TickRecord) -> str:
    """One line of the live view: the tick, its lateness and the age of the chunk its action came from."""
    if record.observed_at is None:
        age = "holding the safe action"
    else:
        age = f"chunk {record.chunk} age {1000 * (record.at - record.observed_at):.0f} ms"
    return f"tick {record.tick:>6}  lateness {1000 * record.lateness:6.2f} ms  {age}"
