"""Simulated environments to measure the control loop on, and their simulated chunking policies (CPU, no assets).

``PointTracking``: a 2-D point robot (velocity commands) tracking a target that circles, pushed at set times.
``CartPole``: gymnasium's classic-control cart-pole (extra ``[control]``) with a continuous force and pole kicks.
Each comes with a planner that computes a chunk open-loop from one observation with an imperfect model (the target
extrapolated in a straight line; the pole 10 % longer than it is), so a chunk's quality degrades with the age of
its input, and a ``model(obs, action) -> obs`` that rollforward uses to predict the state at arrival.
:class:`SimulatedPolicy` wraps a planner with a latency model (sleeping on the loop's clock).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planweave.control.loop import ChunkRequest
from planweave.control.realign import Action, Observation
from planweave.extras import require

Vec = tuple[float, float]


@dataclass(frozen=True)
class PointObs:
    """What the point robot sees: time, its position, the target's position and velocity; ``done`` at the end."""

    t: float
    x: float
    y: float
    tx: float
    ty: float
    tvx: float
    tvy: float
    done: bool


class PointTracking:
    """A point robot at up to ``vmax`` m/s tracking a target circling at ``radius`` m, ``omega`` rad/s, pushed by
    ``push`` m in a random direction every ``push_every`` s (from ``first_push`` s); ``duration`` s long."""

    def __init__(self, *, seed: int = 0, duration: float = 20.0, radius: float = 1.0, omega: float = 0.8,
                 vmax: float = 1.5, push: float = 0.5, push_every: float = 2.5, first_push: float = 1.5,
                 tolerance: float = 0.3) -> None:
        self.duration, self.radius, self.omega, self.vmax, self.tolerance = duration, radius, omega, vmax, tolerance
        rng = random.Random(seed)
        self.pushes: list[tuple[float, float, float]] = []
        t = first_push
        while t < duration:
            angle = rng.uniform(0, 2 * math.pi)
            self.pushes.append((t, push * math.cos(angle), push * math.sin(angle)))
            t += push_every
        self.t, self.x, self.y, self.tick = 0.0, radius, 0.0, 0
        self.next_push = 0
        self.disturbed_ticks: list[int] = []  # the ticks whose step applied a push
        self.errors: list[tuple[float, float]] = []  # (time, distance to the target) before each step

    def target(self, t: float) -> tuple[Vec, Vec]:
        a = self.omega * t
        r, w = self.radius, self.omega
        return (r * math.cos(a), r * math.sin(a)), (-r * w * math.sin(a), r * w * math.cos(a))

    def observe(self) -> PointObs:
        (tx, ty), (tvx, tvy) = self.target(self.t)
        return PointObs(self.t, self.x, self.y, tx, ty, tvx, tvy, self.t >= self.duration - 1e-9)

    def act(self, action: Action, dt: float) -> None:
        (tx, ty), _ = self.target(self.t)
        self.errors.append((self.t, math.hypot(tx - self.x, ty - self.y)))
        vx, vy = _clip_speed(action, self.vmax)
        self.x += vx * dt
        self.y += vy * dt
        self.t += dt
        while self.next_push < len(self.pushes) and self.pushes[self.next_push][0] <= self.t + 1e-9:
            _, dx, dy = self.pushes[self.next_push]
            self.x += dx
            self.y += dy
            self.next_push += 1
            self.disturbed_ticks.append(self.tick)
        self.tick += 1

    def snapshot(self) -> dict[str, Any]:
        return {"t": self.t, "x": self.x, "y": self.y, "tick": self.tick, "next_push": self.next_push}

    def restore(self, state: dict[str, Any]) -> None:
        self.t, self.x, self.y = float(state["t"]), float(state["x"]), float(state["y"])
        self.tick, self.next_push = int(state["tick"]), int(state["next_push"])

    def success(self) -> bool:
        """Within ``tolerance`` of the target at least 75 % of the time."""
        near = sum(1 for _, e in self.errors if e <= self.tolerance)
        return bool(self.errors) and near >= 0.75 * len(self.errors)

    def tracking_error(self) -> float:
        return sum(e for _, e in self.errors) / len(self.errors) if self.errors else 0.0


def _clip_speed(action: Action, vmax: float) -> Vec:
    vx, vy = float(action[0]), float(action[1])
    speed = math.hypot(vx, vy)
    if speed > vmax:
        vx, vy = vx * vmax / speed, vy * vmax / speed
    return vx, vy


def point_model(obs: PointObs, action: Action, dt: float, vmax: float = 1.5) -> PointObs:
    """One tick of the point robot as the planner believes it: its own motion exact, the target straight on."""
    vx, vy = _clip_speed(action, vmax)
    return replace(obs, t=obs.t + dt, x=obs.x + vx * dt, y=obs.y + vy * dt, tx=obs.tx + obs.tvx * dt,
                   ty=obs.ty + obs.tvy * dt)


def point_planner(obs: PointObs, horizon: int, dt: float, gain: float = 4.0, vmax: float = 1.5) -> list[Vec]:
    """A chunk of velocity commands: chase the target extrapolated in a straight line, open-loop."""
    actions: list[Vec] = []
    state = obs
    for _ in range(horizon):
        action = _clip_speed((state.tvx + gain * (state.tx - state.x), state.tvy + gain * (state.ty - state.y)), vmax)
        actions.append(action)
        state = point_model(state, action, dt, vmax)
    return actions


@dataclass(frozen=True)
class CartObs:
    """The cart-pole's state; ``fallen`` when it left its bounds, ``done`` then or at the end of the episode."""

    t: float
    x: float
    x_dot: float
    theta: float
    theta_dot: float
    fallen: bool
    done: bool


class CartPole:
    """gymnasium's ``CartPoleEnv`` driven by a force in [-1, 1] x 10 N, the pole kicked by ``kick`` rad/s every
    ``kick_every`` s (random sign); ``duration`` s long. Needs the ``[control]`` extra."""

    def __init__(self, *, seed: int = 0, duration: float = 10.0, kick: float = 0.6, kick_every: float = 2.0,
                 first_kick: float = 1.0) -> None:
        require("control", "the CartPole environment")
        import numpy as np
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        self._array = np.array
        self.env: Any = CartPoleEnv()  # gymnasium is untyped where it matters: its state is a numpy array
        self.env.reset(seed=seed)
        self.base_force = float(self.env.force_mag)
        self.duration = duration
        rng = random.Random(seed)
        self.kicks: list[tuple[float, float]] = []
        t = first_kick
        while t < duration:
            self.kicks.append((t, kick * rng.choice((-1.0, 1.0))))
            t += kick_every
        self.t, self.tick, self.next_kick, self.fallen = 0.0, 0, 0, False
        self.disturbed_ticks: list[int] = []
        self.errors: list[tuple[float, float]] = []  # (time, |pole angle|)

    def _state(self) -> tuple[float, float, float, float]:
        x, x_dot, theta, theta_dot = (float(v) for v in self.env.state)
        return x, x_dot, theta, theta_dot

    def observe(self) -> CartObs:
        x, x_dot, theta, theta_dot = self._state()
        return CartObs(self.t, x, x_dot, theta, theta_dot, self.fallen,
                       self.fallen or self.t >= self.duration - 1e-9)

    def act(self, action: Action, dt: float) -> None:
        self.errors.append((self.t, abs(self._state()[2])))
        if not self.fallen:
            u = max(-1.0, min(1.0, float(action)))
            self.env.tau = dt
            self.env.force_mag = self.base_force * abs(u)
            _, _, terminated, _, _ = self.env.step(1 if u > 0 else 0)
            self.fallen = bool(terminated)
        self.t += dt
        while self.next_kick < len(self.kicks) and self.kicks[self.next_kick][0] <= self.t + 1e-9:
            x, x_dot, theta, theta_dot = self._state()
            self.env.state = self._array((x, x_dot, theta, theta_dot + self.kicks[self.next_kick][1]))
            self.next_kick += 1
            self.disturbed_ticks.append(self.tick)
        self.tick += 1

    def snapshot(self) -> dict[str, Any]:
        return {"t": self.t, "tick": self.tick, "next_kick": self.next_kick, "fallen": self.fallen,
                "state": list(self._state())}

    def restore(self, state: dict[str, Any]) -> None:
        self.t, self.tick, self.next_kick = float(state["t"]), int(state["tick"]), int(state["next_kick"])
        self.fallen = bool(state["fallen"])
        self.env.state = self._array([float(v) for v in state["state"]])

    def success(self) -> bool:
        return not self.fallen

    def tracking_error(self) -> float:
        return sum(e for _, e in self.errors) / len(self.errors) if self.errors else 0.0


def cart_model(obs: CartObs, action: Action, dt: float, half_length: float = 0.55) -> CartObs:
    """One tick of the cart-pole as the planner believes it (gymnasium's Euler step, the pole 10 % too long)."""
    gravity, masscart, masspole = 9.8, 1.0, 0.1
    total = masscart + masspole
    force = 10.0 * max(-1.0, min(1.0, float(action)))
    cos, sin = math.cos(obs.theta), math.sin(obs.theta)
    temp = (force + masspole * half_length * obs.theta_dot**2 * sin) / total
    theta_acc = (gravity * sin - cos * temp) / (half_length * (4.0 / 3.0 - masspole * cos**2 / total))
    x_acc = temp - masspole * half_length * theta_acc * cos / total
    return replace(obs, t=obs.t + dt, x=obs.x + dt * obs.x_dot, x_dot=obs.x_dot + dt * x_acc,
                   theta=obs.theta + dt * obs.theta_dot, theta_dot=obs.theta_dot + dt * theta_acc)


CART_GAINS = (0.1, 0.25, 3.0, 0.5)


def cart_planner(obs: CartObs, horizon: int, dt: float) -> list[float]:
    """A chunk of forces: state feedback on the planner's own (imperfect) prediction of the cart-pole, open-loop."""
    k1, k2, k3, k4 = CART_GAINS
    actions: list[float] = []
    state = obs
    for _ in range(horizon):
        u = max(-1.0, min(1.0, k1 * state.x + k2 * state.x_dot + k3 * state.theta + k4 * state.theta_dot))
        actions.append(u)
        state = cart_model(state, u, dt)
    return actions


class SimulatedPolicy:
    """A simulated VLA: ``planner(obs, horizon, dt)`` computed from the request's state, returned after a latency
    drawn uniformly from ``latency_s ± jitter_s`` (seeded), slept on the loop's clock."""

    def __init__(self, planner: Callable[[Observation, int, float], Sequence[Action]], *, latency_s: float,
                 jitter_s: float = 0.0, seed: int = 0) -> None:
        if latency_s < 0 or jitter_s < 0 or jitter_s > latency_s:
            raise ValueError(f"simulated policy latency {latency_s} s ± {jitter_s} s: both must be non-negative and "
                             "the jitter no larger than the latency")
        self.planner, self.latency_s, self.jitter_s = planner, latency_s, jitter_s
        self.rng = random.Random(seed)
        self.calls = 0

    async def __call__(self, request: ChunkRequest) -> Sequence[Action]:
        self.calls += 1
        actions = self.planner(request.obs, request.horizon, request.dt)
        await asyncio.sleep(self.latency_s + self.rng.uniform(-self.jitter_s, self.jitter_s))
        return actions
