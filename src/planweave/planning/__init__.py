"""The planning loop (adapter over the engine and a model client): plan, execute and re-plan, overlapping."""

from planweave.planning.factory import build_planning_loop, planning_options
from planweave.planning.loop import PlanningLoop, PlanningOptions

__all__ = ["PlanningLoop", "PlanningOptions", "build_planning_loop", "planning_options"]
