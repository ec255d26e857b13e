"""Deadline pressure (pure): when a run's forecast says it will likely be late, what to do, once per crossing.

A :class:`PressureMonitor` watches the ``p_deadline`` of a run's successive forecasts. When it falls below the
threshold it fires the policy's actions (``faster_tiers``, ``drop_optional``, ``replan``) and disarms; it re-arms
only once ``p_deadline`` has climbed back to the threshold plus a margin (:data:`REARM_MARGIN`), so a forecast that
hovers around the threshold fires once, not on every refresh. :func:`droppable` says which steps the
``drop_optional`` action may cancel: optional steps not yet finished that no step which is not optional needs.

No I/O and no asyncio: ``allocate/pressure_watch.py`` drives it from a run's ``forecast`` events.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planweave.core.plan.graph import Plan
from planweave.core.plan.model import PRESSURE_ACTIONS, DeadlinePressure, PressureAction
from planweave.core.state import RunState

__all__ = ["DEFAULT_THRESHOLD", "REARM_MARGIN", "Pressure", "PressureError", "PressureMonitor", "droppable",
           "fastest", "policy_for"]

DEFAULT_THRESHOLD = 0.5
"""The ``p_deadline`` below which pressure fires when the plan's ``pressure:`` or ``--deadline-pressure`` gives no
other (pressure is off unless one of the two asks for it)."""

REARM_MARGIN = 0.1
"""How far above the threshold ``p_deadline`` must climb again before pressure can fire a second time."""

_FINISHED = frozenset({"succeeded", "failed", "cancelled", "skipped"})


class PressureError(ValueError):
    """A deadline-pressure setting is wrong; the message names the setting and where."""


def policy_for(plan_pressure: DeadlinePressure | None, threshold: float | None, *,
               where: str = "--deadline-pressure") -> DeadlinePressure | None:
    """The pressure policy of a run: the plan's ``pressure:`` with ``threshold`` (the command line's) in place of
    its ``p_deadline`` when given; None (pressure off) when neither asks for it. Raises :class:`PressureError`
    naming ``where`` for a threshold outside (0, 1]."""
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold) \
                or not 0 < threshold <= 1:
            raise PressureError(f"{where}: expected a probability above 0 and at most 1, got {threshold!r}")
        base = plan_pressure or DeadlinePressure.model_construct(p_deadline=DEFAULT_THRESHOLD,
                                                                 actions=PRESSURE_ACTIONS)
        return base.model_copy(update={"p_deadline": float(threshold)})
    return plan_pressure


@dataclass(frozen=True, slots=True)
class Pressure:
    """Pressure fired: the actions to take, the forecast's ``p_deadline`` and the threshold it fell below, the
    seconds left until the deadline (None when the forecast did not say)."""

    actions: tuple[PressureAction, ...]
    p_deadline: float
    threshold: float
    remaining_s: float | None = None
    crossing: int = 1  # how many times pressure has fired in this run, this one included

    def journaled(self, action: PressureAction, **more: Any) -> dict[str, Any]:
        """The ``escalation`` event of one action (rung ``deadline_pressure``)."""
        data: dict[str, Any] = {"rung": "deadline_pressure", "action": action, "p_deadline": round(self.p_deadline, 4),
                                "threshold": self.threshold, "crossing": self.crossing}
        if self.remaining_s is not None:
            data["remaining_s"] = round(self.remaining_s, 3)
        data.update(more)
        return data


@dataclass(slots=True)
class PressureMonitor:
    """Fires ``policy``'s actions when a forecast's ``p_deadline`` falls below its threshold (see the module
    docstring); :meth:`observe` is called with every forecast of the run, in order."""

    policy: DeadlinePressure
    rearm: float = REARM_MARGIN
    armed: bool = True
    crossings: int = 0
    seen: list[float] = field(default_factory=list)  # the p_deadline of every forecast observed (bounded below)

    @property
    def threshold(self) -> float:
        return self.policy.p_deadline

    def observe(self, forecast: Mapping[str, Any]) -> Pressure | None:
        """The pressure one forecast (a ``forecast`` event's data) fires, if any. A forecast without a deadline
        (``p_deadline`` None) or with one that is not a probability changes nothing."""
        p = forecast.get("p_deadline")
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            return None
        p = float(p)
        if len(self.seen) < 1000:
            self.seen.append(p)
        if not self.armed:
            # Re-armed once clear of the threshold by the margin (or at certainty, for thresholds near 1).
            if p >= min(1.0, self.threshold + self.rearm):
                self.armed = True
            return None
        if p >= self.threshold:
            return None
        self.armed = False
        self.crossings += 1
        return Pressure(tuple(self.policy.actions), p, self.threshold, _remaining(forecast), self.crossings)


def _remaining(forecast: Mapping[str, Any]) -> float | None:
    deadline, elapsed = forecast.get("deadline"), forecast.get("elapsed")
    if isinstance(deadline, int | float) and isinstance(elapsed, int | float) and not isinstance(deadline, bool):
        return max(0.0, float(deadline) - float(elapsed))
    return None


def droppable(plan: Plan, state: RunState) -> list[str]:
    """The steps ``drop_optional`` cancels now, in plan order: marked ``optional``, not finished, and needed by no
    step that is not optional (a required step's input is never dropped; its optional inputs' inputs neither)."""
    needed: set[str] = set()
    for sid in reversed(plan.order):  # dependents before their dependencies
        if not plan.steps[sid].optional or any(d in needed for d in plan.dependents[sid]):
            needed.add(sid)
    found: list[str] = []
    for sid in plan.order:
        rec = state.records.get(sid)
        if sid in needed or rec is None or rec.status in _FINISHED:
            continue
        found.append(sid)
    return found


def fastest(durations: Mapping[str, float], tiers: Sequence[str]) -> tuple[str, ...]:
    """The tiers among ``tiers`` whose median call is the shortest (ties kept, in the step's order)."""
    if not tiers:
        return ()
    best = min(durations[t] for t in tiers)
    return tuple(t for t in tiers if durations[t] == best)
