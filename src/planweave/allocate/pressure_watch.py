"""Deadline pressure on a running run: its ``forecast`` events drive a
:class:`~planweave.allocate.pressure.PressureMonitor`, and the actions it fires are carried out and journaled.

A :class:`PressureWatch` listens to one run (as ``forecast/live.py`` does). When a forecast's ``p_deadline`` falls
below the policy's threshold it takes, in the policy's order, the actions that apply to the run:

- ``faster_tiers``: the run's :class:`~planweave.allocate.AllocationSeam` gives its remaining ``model: auto`` steps
  the fastest of their tiers, and its cascades (``model: cascade``) the fastest tier at or above the one their
  monitors brought them to (no seam, or hurried already: nothing to do);
- ``drop_optional``: the steps :func:`~planweave.allocate.pressure.droppable` names are cancelled
  (:meth:`Run.cancel_step`: not resumable, their pending dependents skipped); none left: nothing to do;
- ``replan``: a goal run's planning loop re-plans with the time left stated in the prompt (no planner: nothing).

Each action taken is journaled first, as an ``escalation`` event ``{rung: "deadline_pressure", action, p_deadline,
threshold, remaining_s, crossing, steps?}``. The actions run in a later loop callback, never inside the engine's
emission of the forecast event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from planweave.allocate.pressure import Pressure, PressureMonitor, droppable
from planweave.allocate.seam import DONE, AllocationSeam
from planweave.core.events import Event, EventKind
from planweave.core.plan.graph import Plan
from planweave.core.plan.model import DeadlinePressure
from planweave.core.state import RunState

if TYPE_CHECKING:
    from planweave.engine.runtime import Engine, Run

__all__ = ["PressureWatch", "PressuredRun", "Replanner", "forecast_and_watch"]


class PressuredRun(Protocol):
    """What the watch needs of a run (``engine.runtime.Run`` is one)."""

    id: str

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> RunState: ...

    @property
    def finished(self) -> bool: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...

    def subscribe(self, listener: Callable[[Event], None]) -> None: ...

    def cancel_step(self, sid: str, reason: str) -> bool: ...


class Replanner(Protocol):
    """A goal run's planning loop (``planning.PlanningLoop`` is one): asked to re-plan under deadline pressure."""

    def replan_for_deadline(self, remaining_s: float | None, reason: str) -> bool: ...


class PressureWatch:
    """Carries out deadline pressure for one run (see the module docstring); ``taken`` lists the escalations it
    journaled."""

    def __init__(self, run: PressuredRun, policy: DeadlinePressure, *, seam: AllocationSeam | None = None,
                 planner: Replanner | None = None, tool: str = "llm") -> None:
        self.run = run
        self.monitor = PressureMonitor(policy)
        self.seam = seam
        self.planner = planner
        self.tool = tool
        self.taken: list[dict[str, Any]] = []
        self._closed = False
        run.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """The run's listener: a forecast may fire pressure; the run's end stops the watch."""
        if self._closed:
            return
        if event.kind == "run_finished":
            self._closed = True
        elif event.kind == "forecast":
            pressure = self.monitor.observe(event.data)
            if pressure is not None:
                asyncio.get_running_loop().call_soon(self.act, pressure)

    def act(self, pressure: Pressure) -> None:
        """Take ``pressure``'s actions that apply to the run now, each journaled before it is carried out."""
        run = self.run
        if self._closed or run.finished or run.state.status != "running":
            return
        late = f"P(in time) {pressure.p_deadline:.0%} below {pressure.threshold:.0%}"
        for action in pressure.actions:
            if action == "faster_tiers":
                steps = self._auto_steps()
                if self.seam is not None and steps and self.seam.hurry(run.id):
                    self._journal(pressure.journaled(action, steps=steps, reason=(
                        f"{late}: the fastest tiers for {', '.join(steps)}")))
            elif action == "drop_optional":
                steps = droppable(run.plan, run.state)
                if steps:
                    self._journal(pressure.journaled(action, steps=steps, reason=(
                        f"{late}: dropped the optional {', '.join(steps)}")))
                    why = f"deadline pressure: {late}; an optional step, dropped"
                    for sid in steps:
                        run.cancel_step(sid, why)
            elif action == "replan" and self.planner is not None:
                left = pressure.remaining_s
                reason = (f"deadline pressure: the forecast gives the run a {pressure.p_deadline:.0%} chance to "
                          f"finish in time (below {pressure.threshold:.0%})"
                          + ("" if left is None else f"; {left:.0f} s remain until the deadline")
                          + ". Write a remaining plan that fits in the time left: fewer and faster steps, leave out "
                          "what the goal can do without.")
                if self.planner.replan_for_deadline(left, reason):
                    self._journal(pressure.journaled(action, reason=(
                        f"{late}: re-plan" + ("" if left is None else f" with {left:.0f} s left"))))

    def _auto_steps(self) -> list[str]:
        """The run's ``model: auto`` and ``model: cascade`` steps not yet finished, in plan order (a hurried
        cascade runs its steps on the fastest tier its monitors allow: ``CascadeSeam``)."""
        plan, records = self.run.plan, self.run.state.records
        return [sid for sid in plan.order
                if plan.steps[sid].tool == self.tool and plan.steps[sid].args.get("model") in ("auto", "cascade")
                and (rec := records.get(sid)) is not None and rec.status not in DONE]

    def _journal(self, data: dict[str, Any]) -> None:
        self.taken.append(data)
        self.run.record("escalation", data)


def forecast_and_watch(engine: Engine, run: Run, *, deadline_at: float | None, budget_usd: float | None,
                       threshold: float | None = None, seam: AllocationSeam | None = None,
                       planner: Replanner | None = None) -> PressureWatch | None:
    """Start ``run``'s live forecast (with a deadline at ``deadline_at`` on the engine's clock, or a dollar budget)
    and, with a deadline, the deadline pressure its plan's ``pressure:`` (``threshold`` in place of its
    ``p_deadline``) asks for, in the same loop turn: what ``planweave run`` does, for the runs a worker starts or
    takes over and the runs a server starts, recovers or resumes (a goal run's ``planner`` re-plans under
    pressure). The watch, or None (no pressure asked for)."""
    created = run.state.created_at
    if created is None or (deadline_at is None and budget_usd is None):
        return None
    from planweave.allocate.pressure import policy_for
    from planweave.forecast.live import LiveOptions, start_live_forecast

    start_live_forecast(engine, run, LiveOptions(None if deadline_at is None else deadline_at - created, budget_usd,
                                                 concurrency=engine.concurrency,
                                                 capacities=dict(engine.capacities)))
    policy = policy_for(run.plan.spec.pressure, threshold)
    if policy is None or deadline_at is None:
        return None
    return PressureWatch(run, policy, seam=seam, planner=planner)
