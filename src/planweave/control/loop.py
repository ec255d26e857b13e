"""The control loop: actions at a fixed rate on the engine's clock while the next chunk is inferred concurrently.

Each tick ``k`` is due at ``origin + k/rate_hz``. The loop sleeps until it is due, measures its lateness, takes in a
chunk that arrived since the last tick (refusing it when older than ``max_age_s``, else realigning and splicing it
into the :class:`~planweave.control.realign.ActionPlan`), asks for the next chunk when the trigger says so, and
runs the action planned for the tick, or the safe action when none is. A tick whose time passed before the loop got
to it is journaled as missed (``control_tick_missed``), never silently skipped.

A control run journals its own event kinds (``control_*`` in ``engine/events.py``) under its own run id. Resume
(``run(resume=RUN_ID)``) continues from the last ``control_checkpoint``: its tick, its counters and, when the
environment can ``restore``, its state; the plan starts empty, so the loop holds the safe action until a fresh
chunk arrives: no chunk inferred before the crash is used after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, cast

from planweave.control.events import ControlKind
from planweave.control.realign import (
    Action,
    ActionPlan,
    Aligned,
    Chunk,
    CustomRealign,
    Observation,
    Realign,
    RealignName,
    realign_by_name,
)
from planweave.control.trigger import InferenceTrigger, LatencyEstimate
from planweave.core.clock import Clock, RealClock, VirtualClock, VirtualEventLoop
from planweave.core.errors import PlanweaveError
from planweave.core.events import Event
from planweave.journal import open_journal
from planweave.journal.base import Journal

Mode = Literal["async", "sync"]
Status = Literal["done", "deadline", "budget"]


class ControlError(PlanweaveError):
    """A control loop was set up wrongly, or its policy or environment broke it (the message says where)."""


class Environment(Protocol):
    """What the loop acts on: ``observe`` the present, ``act`` one tick. ``snapshot``/``restore`` (optional, JSON)
    let a resumed run continue a simulation from its last checkpoint."""

    def observe(self) -> Observation: ...

    def act(self, action: Action, dt: float) -> Awaitable[None] | None: ...


@dataclass(frozen=True)
class ChunkRequest:
    """What the policy is asked: the chunk ``chunk``'s actions from tick ``start_tick`` on, inferred from ``obs``."""

    chunk: int
    obs: Observation
    tick: int
    start_tick: int
    at: float
    horizon: int
    dt: float


Policy = Callable[[ChunkRequest], Awaitable[Sequence[Action]]]


@dataclass(frozen=True)
class TickRecord:
    """One tick as run: when, how late, what action, from which chunk (None: the safe action was held)."""

    tick: int
    at: float
    lateness: float
    action: Action
    chunk: int | None
    observed_at: float | None


@dataclass(frozen=True)
class Splice:
    """One chunk taken in (or refused) on arrival."""

    chunk: int
    observed_tick: int
    observed_at: float
    start_tick: int
    arrived_tick: int
    arrived_at: float
    dropped: int
    kept_from: int
    refused: bool = False


@dataclass
class ControlReport:
    """What a control run did: its outcome, the counters, and every tick and splice (``trace``, ``splices``)."""

    run_id: str
    status: Status = "done"
    ticks: int = 0
    missed: int = 0
    idle_ticks: int = 0
    holds: int = 0
    requested: int = 0
    spliced: int = 0
    refused: int = 0
    cancelled: int = 0
    discarded: int = 0
    superseded: int = 0
    max_lateness: float = 0.0
    resumed_at: int | None = None
    trace: list[TickRecord] = field(default_factory=list)
    splices: list[Splice] = field(default_factory=list)

    @property
    def idle_frac(self) -> float:
        return self.idle_ticks / self.ticks if self.ticks else 0.0

    def counters(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("trace", "splices", "run_id")}

    def summary(self) -> dict[str, Any]:
        return {**self.counters(), "run_id": self.run_id, "idle_frac": self.idle_frac}


@dataclass(frozen=True)
class ControlConfig:
    """The loop's settings (journaled with ``control_started``)."""

    rate_hz: float
    horizon: int
    execute: int
    realign: str
    mode: Mode
    max_age_s: float | None
    max_calls: int | None
    blend: int
    latency_hint_s: float
    checkpoint_every: int


class _Inference:
    """The one chunk in flight: its request and the task computing it."""

    def __init__(self, request: ChunkRequest, task: asyncio.Task[tuple[Sequence[Action], float]]) -> None:
        self.request = request
        self.task = task


class ControlLoop:
    """Run ``env`` at ``rate_hz`` with chunks of ``horizon`` actions from ``policy`` (see the module docstring).

    ``execute``: in ``sync`` mode, the actions of each chunk run before the loop stops to infer the next; in
    ``async`` mode, the actions run from a chunk before the next is requested (unless ``trigger`` says otherwise).
    ``realign``: ``drop_expired``, ``rollforward`` (needs ``model(obs, action) -> obs``), ``nearest`` (needs
    ``distance(obs, waypoint)``), a :class:`Realign`, or a function ``(chunk, now_tick, obs) -> Aligned``.
    """

    def __init__(
        self,
        *,
        env: Environment,
        policy: Policy,
        rate_hz: float,
        horizon: int,
        execute: int,
        realign: RealignName | Realign | Callable[[Chunk, int, Observation], Aligned] = "drop_expired",
        model: Callable[[Observation, Action], Observation] | None = None,
        distance: Callable[[Observation, Action], float] | None = None,
        mode: Mode = "async",
        trigger: InferenceTrigger | None = None,
        monitor: Callable[[Observation], bool] | None = None,
        safe_action: Action = None,
        max_age_s: float | None = None,
        max_calls: int | None = None,
        blend: int = 0,
        latency_hint_s: float = 0.0,
        checkpoint_every: int | None = None,
        journal: str | Journal | None = None,
        clock: Clock | None = None,
        observer: Callable[[TickRecord], None] | None = None,
    ) -> None:
        if rate_hz <= 0 or not math.isfinite(rate_hz):
            raise ControlError(f"control loop rate_hz={rate_hz}: must be a positive number")
        if horizon < 1:
            raise ControlError(f"control loop horizon={horizon}: must be at least 1 action")
        if not 1 <= execute <= horizon:
            raise ControlError(f"control loop execute={execute}: must be between 1 and horizon={horizon}")
        if mode not in ("async", "sync"):
            raise ControlError(f"control loop mode '{mode}' is not known: use async or sync")
        if max_age_s is not None and max_age_s <= 0:
            raise ControlError(f"control loop max_age_s={max_age_s}: must be positive")
        if max_calls is not None and max_calls < 1:
            raise ControlError(f"control loop max_calls={max_calls}: must be at least 1")
        if isinstance(realign, str):
            try:
                self.realign = realign_by_name(realign, model=model, distance=distance)
            except ValueError as exc:
                raise ControlError(f"control loop: {exc}") from None
        elif callable(getattr(realign, "align", None)):
            self.realign = cast(Realign, realign)
        else:
            function = cast(Callable[[Chunk, int, Observation], Aligned], realign)
            self.realign = CustomRealign(function, getattr(function, "__name__", "custom"))
        self.env = env
        self.policy = policy
        self.dt = 1.0 / rate_hz
        self.config = ControlConfig(rate_hz, horizon, execute, self.realign.name, mode, max_age_s, max_calls, blend,
                                    latency_hint_s, checkpoint_every or max(1, round(rate_hz)))
        self.trigger = trigger or InferenceTrigger(below=horizon - execute + 1)
        self.monitor = monitor
        self.safe_action = safe_action
        self.journal_spec = journal
        self.clock = clock
        self.observer = observer

    async def run(self, until: Callable[[Observation], bool] | None = None, deadline: float | None = None, *,
                  run_id: str | None = None, resume: str | None = None) -> ControlReport:
        """Run until ``until(obs)`` holds, ``deadline`` seconds pass, or the ``max_calls`` budget is spent."""
        clock = self.clock or (VirtualClock() if isinstance(asyncio.get_running_loop(), VirtualEventLoop)
                               else RealClock())
        async with self._journal() as journal:
            return await _Run(self, clock, journal, resume or run_id or f"control-{uuid.uuid4().hex[:12]}",
                              resume is not None).run(until, deadline)

    @contextlib.asynccontextmanager
    async def _journal(self) -> AsyncIterator[Journal | None]:
        if self.journal_spec is None or not isinstance(self.journal_spec, str):
            yield self.journal_spec
            return
        async with open_journal(self.journal_spec) as journal:
            yield journal


class _Run:
    """One run of a :class:`ControlLoop`: its plan, its chunk in flight, its report."""

    def __init__(self, loop: ControlLoop, clock: Clock, journal: Journal | None, run_id: str, resume: bool) -> None:
        self.loop = loop
        self.cfg = loop.config
        self.clock = clock
        self.journal = journal
        self.report = ControlReport(run_id)
        self.resume = resume
        self.plan = ActionPlan()
        self.latency = LatencyEstimate(self.cfg.latency_hint_s, loop.dt)
        self.inflight: _Inference | None = None
        self.last_request: int | None = None
        self.next_chunk = 0
        self.holding = False
        self.last_tick: int | None = None

    def emit(self, kind: ControlKind, data: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.append(Event(self.report.run_id, kind, self.clock.now(), None, data))

    async def run(self, until: Callable[[Observation], bool] | None, deadline: float | None) -> ControlReport:
        tick = await self._restore() if self.resume else 0
        self.emit("control_started", {"config": asdict(self.cfg), "tick": tick, "resumed": self.resume})
        started = self.clock.now()
        origin = started - tick * self.loop.dt
        try:
            async with asyncio.TaskGroup() as group:
                try:
                    status = await self._ticks(group, tick, origin, started, until, deadline)
                finally:
                    if self.inflight is not None:
                        self.inflight.task.cancel()
        except BaseExceptionGroup as group_error:
            first = group_error.exceptions[0]
            raise first from None
        self.report.status = status
        if self.last_tick is not None:
            self._checkpoint(self.last_tick)
        self.emit("control_finished", {"status": status, "ticks": self.report.ticks,
                                       "report": self.report.summary()})
        if self.journal is not None:
            await self.journal.flush()
        return self.report

    async def _restore(self) -> int:
        if self.journal is None:
            raise ControlError(f"cannot resume control run '{self.report.run_id}': the loop has no journal")
        events = await self.journal.read(self.report.run_id)
        if not events:
            raise ControlError(f"cannot resume control run '{self.report.run_id}': the journal "
                               f"{self.journal.url} has no such run")
        checkpoints = [e for e in events if e.kind == "control_checkpoint"]
        if any(e.kind == "control_finished" for e in events):
            raise ControlError(f"cannot resume control run '{self.report.run_id}': it finished")
        if not checkpoints:
            return 0
        last = checkpoints[-1].data
        restore = getattr(self.loop.env, "restore", None)
        if restore is not None:
            restore(last["state"])
        for name, value in last["counters"].items():
            if name in ("ticks", "missed", "idle_ticks", "holds", "requested", "spliced", "refused", "cancelled",
                        "discarded", "superseded", "max_lateness"):
                setattr(self.report, name, value)
        self.next_chunk = self.report.requested
        tick = int(last["tick"]) + 1
        self.report.resumed_at = tick
        return tick

    def _checkpoint(self, tick: int) -> None:
        snapshot = getattr(self.loop.env, "snapshot", None)
        state = snapshot() if snapshot is not None else None
        self.emit("control_checkpoint", {"tick": tick, "at": self.clock.now(), "state": state,
                                         "counters": self.report.counters()})

    async def _ticks(self, group: asyncio.TaskGroup, tick: int, origin: float, started: float,
                     until: Callable[[Observation], bool] | None, deadline: float | None) -> Status:
        dt = self.loop.dt
        report = self.report
        while True:
            due = origin + tick * dt
            now = self.clock.now()
            if now < due:
                await self.clock.sleep(due - now)
                now = self.clock.now()
            tick, lateness = self._skip_missed(tick, origin, now)
            report.max_lateness = max(report.max_lateness, lateness)
            if deadline is not None and now - started >= deadline:
                return "deadline"
            obs = self.loop.env.observe()
            if until is not None and until(obs):
                return "done"
            self._take_arrival(tick, obs)
            if self.loop.monitor is not None and self.loop.monitor(obs):
                self._request(group, tick, obs, replace=True)
            elif self._request_due(tick):
                self._request(group, tick, obs, replace=False)
            if (self.plan.remaining(tick) == 0 and self.inflight is None and self.cfg.max_calls is not None
                    and report.requested >= self.cfg.max_calls):
                return "budget"
            action, chunk, observed_at = self._action(tick)
            record = TickRecord(tick, now, lateness, action, chunk, observed_at)
            report.trace.append(record)
            if self.loop.observer is not None:
                self.loop.observer(record)
            try:
                acted = self.loop.env.act(action, dt)
                if inspect.isawaitable(acted):
                    await acted
            except Exception as exc:
                raise ControlError(f"control run '{report.run_id}': the environment failed at tick {tick}: "
                                   f"{type(exc).__name__}: {exc}") from exc
            report.ticks += 1
            self.last_tick = tick
            if (tick + 1) % self.cfg.checkpoint_every == 0:
                self._checkpoint(tick)
                if self.journal is not None:
                    await self.journal.flush()
            tick += 1

    def _skip_missed(self, tick: int, origin: float, now: float) -> tuple[int, float]:
        """The tick to run at ``now`` and its lateness; each tick whose time has passed is journaled as missed."""
        dt = self.loop.dt
        lateness = max(0.0, now - (origin + tick * dt))
        if lateness < dt:
            return tick, lateness
        missed = int(lateness // dt)
        for skipped in range(tick, tick + missed):
            self.emit("control_tick_missed", {"tick": skipped, "due": origin + skipped * dt,
                                              "lateness_s": now - (origin + skipped * dt)})
        self.report.missed += missed
        tick += missed
        return tick, now - (origin + tick * dt)

    def _action(self, tick: int) -> tuple[Action, int | None, float | None]:
        """The action for ``tick``: the planned one, or the safe one (a hold, journaled when it begins)."""
        planned = self.plan.action_at(tick)
        if planned is not None:
            self.holding = False
            return planned
        self.report.idle_ticks += 1
        if not self.holding:
            self.holding = True
            self.report.holds += 1
            self.emit("control_hold", {"tick": tick, "reason": self._hold_reason()})
        return self.loop.safe_action, None, None

    def _hold_reason(self) -> str:
        if self.cfg.max_calls is not None and self.report.requested >= self.cfg.max_calls:
            return "budget of model calls spent"
        if self.report.splices and self.report.splices[-1].refused:
            return "last chunk refused as too old"
        if self.inflight is not None:
            return "waiting for a chunk" if self.report.spliced else "no chunk yet"
        return "no valid chunk left"

    def _request_due(self, tick: int) -> bool:
        if self.cfg.max_calls is not None and self.report.requested >= self.cfg.max_calls:
            return False
        if self.cfg.mode == "sync":
            # Stop, infer, execute: the next chunk is asked for once this one's actions have all run.
            return self.inflight is None and self.plan.remaining(tick) == 0
        return self.loop.trigger.due(tick, self.plan.remaining(tick), self.last_request, self.inflight is not None)

    def _request(self, group: asyncio.TaskGroup, tick: int, obs: Observation, *, replace: bool) -> None:
        if self.inflight is not None:
            if not replace:
                return
            self.inflight.task.cancel()
            self.inflight = None
            self.report.cancelled += 1
        if self.cfg.max_calls is not None and self.report.requested >= self.cfg.max_calls:
            return
        pending = self.plan.pending(tick) if self.cfg.mode == "async" else []
        lat = self.latency.ticks if self.cfg.mode == "async" else 0
        pending = [*pending[:lat], *[self.loop.safe_action] * max(0, lat - len(pending))]
        conditioned, start = self.loop.realign.condition(obs, tick, pending, lat)
        request = ChunkRequest(self.next_chunk, conditioned, tick, start, self.clock.now(), self.cfg.horizon,
                               self.loop.dt)
        self.next_chunk += 1
        self.report.requested += 1
        self.last_request = tick
        self.inflight = _Inference(request, group.create_task(self._infer(request)))

    async def _infer(self, request: ChunkRequest) -> tuple[Sequence[Action], float]:
        try:
            actions = await self.loop.policy(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ControlError(f"control run '{self.report.run_id}': the policy failed on chunk {request.chunk} "
                               f"(requested at tick {request.tick}): {type(exc).__name__}: {exc}") from exc
        if isinstance(actions, str | bytes) or not isinstance(actions, Sequence) or not actions:
            raise ControlError(f"control run '{self.report.run_id}': the policy returned "
                               f"{type(actions).__name__} for chunk {request.chunk}, not a non-empty list of actions")
        return actions, self.clock.now()

    def _take_arrival(self, tick: int, obs: Observation) -> None:
        inflight = self.inflight
        if inflight is None or not inflight.task.done():
            return
        self.inflight = None
        actions, arrived_at = inflight.task.result()
        req = inflight.request
        chunk = Chunk(req.chunk, tuple(actions), req.start_tick, req.tick, req.at, tick, arrived_at)
        self.latency.observe(arrived_at - req.at)
        age = arrived_at - req.at
        report = self.report
        if self.cfg.max_age_s is not None and age > self.cfg.max_age_s:
            report.refused += 1
            report.discarded += len(chunk.actions)
            report.splices.append(Splice(chunk.id, chunk.observed_tick, chunk.observed_at, chunk.start_tick, tick,
                                         arrived_at, len(chunk.actions), tick, refused=True))
            self.emit("control_chunk_refused", {"chunk": chunk.id, "age_s": age, "max_age_s": self.cfg.max_age_s,
                                                "tick": tick})
            if self.plan.action_at(tick) is None:
                self.holding = False  # no valid chunk is left: the hold that follows is raised anew, with its reason
            return
        if self.cfg.mode == "sync":
            # The loop stood still while it thought: the chunk runs from now, its first `execute` actions only.
            aligned = Aligned(chunk.actions[:self.cfg.execute], tick, 0)
        else:
            aligned = self.loop.realign.align(chunk, tick, obs)
        report.superseded += self.plan.splice(aligned, chunk, blend_steps=self.cfg.blend)
        report.spliced += 1
        report.discarded += aligned.dropped
        report.splices.append(Splice(chunk.id, chunk.observed_tick, chunk.observed_at, chunk.start_tick, tick,
                                     arrived_at, aligned.dropped, aligned.start_tick))
        self.emit("control_chunk", {"chunk": chunk.id, "actions": list(chunk.actions),
                                    "observed_tick": chunk.observed_tick, "observed_at": chunk.observed_at,
                                    "start_tick": chunk.start_tick, "arrived_tick": tick, "arrived_at": arrived_at,
                                    "dropped": aligned.dropped, "kept_from": aligned.start_tick})


def replay_splices(events: Sequence[Event], realign: Realign, observations: dict[int, Observation] | None = None,
                   ) -> list[Aligned]:
    """Re-run ``realign`` on every journaled chunk at its journaled arrival tick: the alignments the run made.

    ``observations`` (arrival tick -> observation) is needed only by strategies that look at the state (nearest).
    """
    out = []
    for event in events:
        if event.kind != "control_chunk":
            continue
        d = event.data
        chunk = Chunk(d["chunk"], tuple(_as_action(a) for a in d["actions"]), d["start_tick"], d["observed_tick"],
                      d["observed_at"], d["arrived_tick"], d["arrived_at"])
        obs = (observations or {}).get(chunk.arrived_tick)
        out.append(realign.align(chunk, chunk.arrived_tick, obs))
    return out


def _as_action(value: Any) -> Action:
    return tuple(value) if isinstance(value, list) else value
