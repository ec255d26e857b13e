"""Starting a goal run on a built planning loop, with the live forecast and the deadline pressure it asks for: the one
way ``planweave run --goal``, ``POST /runs`` (``server/limits.py``) and ``planweave.run_goal`` start one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planweave.engine.runtime import Run
    from planweave.planning.loop import PlanningLoop


async def launch_goal(loop: PlanningLoop, goal: str, *, run_id: str | None = None, priority: float = 0.0,
                      forecast: bool = True) -> Run:
    """Start planning ``goal`` on ``loop`` and return its run at once, with the run's live forecast when its limits
    have a deadline or a dollar budget, and the deadline pressure ``loop.pressure`` asks for.

    The loop (built by :func:`planweave.planning.build_planning_loop`) enforces the budget, the deadline and the
    re-plans; the forecast and the pressure watch start in the same loop turn as the run (a run with neither limit
    has no forecast). ``forecast=False``: a forecast only when deadline pressure acts on it (``planweave run --goal``,
    whose run nobody watches; ``POST /runs`` and the Python API forecast for the dashboard and the journal).
    """
    from planweave.allocate.pressure_watch import forecast_and_watch

    run = await loop.start(goal, run_id=run_id, priority=priority)
    if not forecast and loop.pressure is None:
        return run
    limits = loop.limits
    created = run.state.created_at
    deadline = None if limits is None else limits.deadline
    deadline_at = None if deadline is None or created is None else created + deadline
    forecast_and_watch(loop.engine, run, deadline_at=deadline_at,
                       budget_usd=None if limits is None else limits.budget_usd,
                       threshold=loop.pressure, planner=loop)
    return run
