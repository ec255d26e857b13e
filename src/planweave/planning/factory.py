"""The one way to build a :class:`PlanningLoop` for a goal run, used by ``planweave run --goal`` and the server.

Both edges hand over the run's :class:`~planweave.limits.RunLimits` (budget, deadline, re-plans) and the
planning flags; this module turns them into the loop's budget, its ``llm`` tool and its :class:`PlanningOptions`,
so a limit given to either edge means the same thing. A zero budget is a budget (every model call is refused), not
"no budget": only a limit left out (None) is unlimited.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from planweave.allocate.cascade_seam import CascadeSeam, PlannerCascade
from planweave.allocate.model import TierTable
from planweave.engine.runtime import Engine
from planweave.limits import RunLimits
from planweave.models import Budget, Endpoint, ModelClient
from planweave.planning.loop import PlanningLoop, PlanningOptions, PlanVia
from planweave.planning.subplans import DEFAULT_MAX_DEPTH, SUBPLAN_TOOL, SubplanSeam, plan_tool
from planweave.tools import Tool, Toolbox
from planweave.tools.llm import llm_tool

__all__ = ["DEFAULT_PLAN_MAX_TOKENS", "build_planning_loop", "planning_options"]

#: The planner's most tokens per call unless ``--plan-max-tokens`` says otherwise (PlanningOptions' default).
DEFAULT_PLAN_MAX_TOKENS = PlanningOptions().plan_max_tokens


def planning_options(limits: RunLimits, *, plan_max_tokens: int | None = None,
                     ask_human: bool = False) -> PlanningOptions:
    """The loop's options for a run within ``limits``: its deadline and re-plans (the loop's default when None),
    the planner's token cap and the joiner's (at most 1024, never above the planner's), and the ladder's last rung."""
    defaults = PlanningOptions()
    plan_tokens = DEFAULT_PLAN_MAX_TOKENS if plan_max_tokens is None else plan_max_tokens
    return PlanningOptions(
        deadline_s=limits.deadline,
        max_replans=defaults.max_replans if limits.max_replans is None else limits.max_replans,
        plan_max_tokens=plan_tokens,
        join_max_tokens=min(defaults.join_max_tokens, plan_tokens),
        ask_human=ask_human,
    )


def build_planning_loop(
    engine: Engine,
    client: ModelClient,
    tools: Toolbox,
    limits: RunLimits,
    *,
    plan_max_tokens: int | None = None,
    ask_human: bool = False,
    budget: Budget | None = None,
    tiers: TierTable | None = None,
    memory: Callable[[str], Awaitable[str]] | None = None,
    subplans: bool = True,
    max_depth: int = DEFAULT_MAX_DEPTH,
    subplan_depth: int = 0,
    draft: ModelClient | None = None,
    context: Literal["references", "summary"] | None = None,
    endpoint: Endpoint | None = None,
    pressure: float | None = None,
    origin: str | None = None,
    parent: Mapping[str, Any] | None = None,
    planner: PlannerCascade | None = None,
    plan_via: PlanVia | None = None,
) -> PlanningLoop:
    """A planning loop on ``engine`` that plans with ``client`` and may call ``tools`` plus ``llm`` on ``client``.

    The planner, the joiner and the run's ``llm`` steps all spend one budget: ``budget`` if given (a resumed run's,
    already charged with what it spent), else a fresh one of ``limits`` (None when ``limits`` has no budget). A
    catalog that has an ``llm`` tool of its own keeps it. Raises ValueError for ``ask_human`` without the
    ``human.input`` tool in ``tools``. With ``tiers``, the planner is a cascade over them (small first, escalated
    when its monitors fire) and the ``llm`` steps it writes may say ``model: cascade`` (docs/allocation.md).
    With ``subplans`` (the default), a step ``tool: plan`` runs its ``goal`` as a child run at depth
    ``subplan_depth + 1``, at most ``max_depth`` (docs/subplans.md).
    With ``memory`` (a :class:`planweave.memory.MemoryRecall`), the initial plan's prompt carries the verified
    lessons and skills it recalls for the goal (docs/memory.md).
    With ``draft``, a fast model drafts the initial plan ahead of the planner, verified by it (planning/draft.py).
    ``context`` is what the planner sees of the run (None: :class:`PlanningOptions`' default, "references"); a
    child run plans with its parent's. Both it and ``subplans`` are journaled, so a resume passes them again, as is
    ``endpoint``: the one ``client`` was opened on when given (its base URL unless it carries a credential, the name of
    its key's variable and its headers' names; never a key nor a header's value).
    ``pressure`` (a deadline-pressure threshold), ``origin`` (who started the run) and ``parent`` (a sub-plan's
    link to its parent) are journaled too (:class:`PlanningLoop`). ``planner`` takes the place of the tiers' planner
    cascade (an allocated planner, :class:`planweave.allocate.planner_alloc.PlannerAllocation`, on ``budget``).
    ``plan_via`` is how the planner writes plans: ``add_step`` tool calls, JSON Lines text, or (None, ``auto``) tool
    calls when ``client`` speaks a dialect that has them (planning/tool_calls.py); a sub-plan plans the same way.
    """
    spend = budget if budget is not None else limits.budget()
    steps_cascade = None if tiers is None else CascadeSeam(tiers, engine.get)
    catalog = tools if "llm" in tools else tools.merged(Toolbox({"llm": llm_tool(client, spend,
                                                                               cascade=steps_cascade)}))
    if subplans and SUBPLAN_TOOL not in catalog:  # steps saying tool: plan run as child runs (planning/subplans.py)
        catalog = catalog.merged(Toolbox({SUBPLAN_TOOL: _subplan_tool(
            engine, client, tools, limits, spend, plan_max_tokens, max_depth, subplan_depth, context, plan_via)}))
    options = planning_options(limits, plan_max_tokens=plan_max_tokens, ask_human=ask_human)
    if context is not None:
        options = dataclasses.replace(options, context=context)
    if draft is not None:
        options = dataclasses.replace(options, draft=draft)
    if plan_via is not None:
        options = dataclasses.replace(options, plan_via=plan_via)
    if planner is None and tiers is not None:
        planner = PlannerCascade(tiers)
    return PlanningLoop(engine, client, catalog, budget=spend, options=options, limits=limits, cascade=planner,
                        endpoint=endpoint, pressure=pressure, recall=memory, origin=origin, parent=parent)


def _subplan_tool(engine: Engine, client: ModelClient, tools: Toolbox, limits: RunLimits, spend: Budget | None,
                  plan_max_tokens: int | None, max_depth: int, depth: int,
                  context: Literal["references", "summary"] | None = None, plan_via: PlanVia | None = None) -> Tool:
    """The ``plan`` tool of a goal run at ``depth``: each child is built here too, one level deeper, on the same
    client, with the tools it is given and its slice of ``spend``."""

    def build(child_tools: Toolbox, child_limits: RunLimits, child_budget: Budget | None,
              child_depth: int, parent: Mapping[str, Any]) -> PlanningLoop:
        return build_planning_loop(engine, client, child_tools, child_limits, plan_max_tokens=plan_max_tokens,
                                   budget=child_budget, max_depth=max_depth, subplan_depth=child_depth,
                                   context=context, parent=parent, plan_via=plan_via)

    # the parent's deadline is read from its journal when a child starts: the loop may be built before the clock
    # runs (a VirtualClock needs its event loop), and a resumed parent keeps the end it was started with
    return plan_tool(SubplanSeam(engine, build, tools, spend, None, depth, max_depth, limits.max_replans))
