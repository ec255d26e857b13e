"""Sub-plans: a step ``{"tool": "plan", "args": {"goal": ..., "tools": [...], "budget": {...}, "deadline": S}}``
is planned and run as a *child run* of the goal run that holds it.

The child is a goal run of its own (its own plan versions, context, planner and joiner) with the id
``<parent run>.<step>`` (``<parent run>.<step>-2``, ... for later attempts after one ended), journaled in the same
journal with its parent named in ``run_created`` (``options.limits.parent``: run, step, depth). What it may spend is
a *slice* of the parent's budget, reserved from the parent's :class:`~planweave.models.Budget` before the child
starts and settled with what the child really spent when it ends (so the parent's calls and its other children
never count on money a child may still spend); its deadline is the earlier of ``args.deadline`` and the time the
parent has left; its tools are the ones named (default: all the parent's). The step's output is
``{"answer": ..., "summary": ..., "run": child_id}``; a child that does not succeed fails the step, for the parent's
ladder to repair like any failed step.

The ``plan`` tool is idempotent: run again (a retry after an interruption, a resumed parent) it resumes the child
that has not ended instead of starting another, so the child's finished steps are not run again, and a child that
succeeded gives its answer without running anything. Cancelling the parent (or the ``plan`` step alone) cancels the
child; an interruption (the engine closing) leaves both resumable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planweave.core.context import StepContext, current_step
from planweave.core.errors import RunError, ToolError
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine.runtime import Engine, Run
from planweave.limits import JournaledLimits, RunLimits
from planweave.models import Budget, BudgetExceeded, Reservation
from planweave.runtree import parent_link
from planweave.tools import Toolbox
from planweave.tools.registry import Tool

if TYPE_CHECKING:
    from planweave.planning.loop import PlanningLoop

__all__ = ["DEFAULT_MAX_DEPTH", "SUBPLAN_TOOL", "BudgetSlice", "SubplanSeam", "child_run_id", "parent_of",
           "plan_tool", "slice_budget"]

parent_of = parent_link  # the parent link a child journaled (planweave.runtree)

SUBPLAN_TOOL = "plan"
DEFAULT_MAX_DEPTH = 3  # a root goal run is at depth 0; its children at 1, theirs at 2, ...
SUMMARY_CHARS = 200

#: Builds a child's planning loop: (tools it may call, its limits, its budget, its depth) -> loop.
LoopBuilder = Callable[[Toolbox, RunLimits, "Budget | None", int, Mapping[str, Any]], "PlanningLoop"]


@dataclass(frozen=True)
class BudgetSlice:
    """What one child run may spend: dollars, tokens, or both (None: unlimited in that unit)."""

    usd: float | None = None
    tokens: int | None = None


def slice_budget(asked: BudgetSlice | None, remaining_usd: float | None, remaining_tokens: int | None,
                 open_children: int) -> BudgetSlice:
    """The slice a child gets: what it ``asked`` for in each unit, else a fair share of what the parent has left
    (``remaining / (open_children + 1)``: one share for each sub-plan not finished, this one included, and one for
    the parent's own calls). Pure; a slice asked for beyond what is left is refused by the reservation, not here."""
    shares = max(1, open_children) + 1
    usd = asked.usd if asked is not None and asked.usd is not None else (
        None if remaining_usd is None else max(0.0, remaining_usd) / shares)
    tokens = asked.tokens if asked is not None and asked.tokens is not None else (
        None if remaining_tokens is None else max(0, remaining_tokens) // shares)
    return BudgetSlice(usd, tokens)


def child_run_id(parent: str, step: str, attempt: int = 1) -> str:
    """The id of the ``attempt``-th child run of step ``step`` of run ``parent``."""
    return f"{parent}.{step}" if attempt <= 1 else f"{parent}.{step}-{attempt}"


@dataclass(frozen=True)
class SubplanSeam:
    """What the ``plan`` tool of one goal run needs: how to build a child's loop, the tools a child may be given,
    the budget slices are reserved from, the parent's absolute deadline, and the depth limit."""

    engine: Engine
    build: LoopBuilder
    tools: Toolbox
    budget: Budget | None
    deadline_at: float | None  # the parent's end on the engine's clock (None: the one its journal records, if any)
    depth: int = 0  # the depth of the runs this tool is called from (a root goal run: 0)
    max_depth: int = DEFAULT_MAX_DEPTH
    max_replans: int | None = None


def _fail(message: str, kind: str = "subplan") -> ToolError:
    return ToolError(message, kind=kind, retryable=False)


def _asked_slice(budget: Mapping[str, Any] | None) -> BudgetSlice | None:
    if budget is None:
        return None
    unknown = sorted(set(budget) - {"usd", "tokens"})
    if unknown:
        raise _fail(f"plan: budget has unknown key(s) {unknown}: give 'usd' and/or 'tokens'", "invalid_args")
    usd, tokens = budget.get("usd"), budget.get("tokens")
    if usd is not None and (not isinstance(usd, int | float) or isinstance(usd, bool) or not math.isfinite(usd)
                            or usd < 0):
        raise _fail(f"plan: budget.usd must be a number >= 0, got {usd!r}", "invalid_args")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
        raise _fail(f"plan: budget.tokens must be an integer >= 0, got {tokens!r}", "invalid_args")
    return BudgetSlice(None if usd is None else float(usd), tokens)


def _summary(child_id: str, state: RunState, answer: str | None) -> str:
    done = sum(1 for r in state.records.values() if r.status == "succeeded")
    text = (answer or "").strip().replace("\n", " ")
    cut = text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
    return f"sub-plan {child_id} {state.status}: {done}/{len(state.records)} steps" + (f"; {cut}" if cut else "")


def plan_tool(seam: SubplanSeam) -> Tool:
    """The ``plan`` tool of a goal run: runs ``args.goal`` as a child run (see the module docstring)."""
    engine = seam.engine

    async def plan(goal: str, tools: list[str] | None = None, budget: dict[str, Any] | None = None,
                   deadline: float | None = None) -> dict[str, Any]:
        """Plan and run a sub-goal as a child run with its own plan and context: goal; tools (names, default all);
        budget {usd?, tokens?} (default a fair share of what is left); deadline in seconds. Returns answer, summary,
        run."""
        ctx = current_step()
        depth = seam.depth + 1
        if depth > seam.max_depth:
            raise _fail(f"plan: sub-plan depth limit ({seam.max_depth}) reached: run '{ctx.run_id}' is at depth "
                        f"{seam.depth}, so step '{ctx.step_id}' cannot start a child at depth {depth}",
                        "depth_limit")
        if not goal.strip():
            raise _fail("plan: goal is empty", "invalid_args")
        if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
            raise _fail(f"plan: deadline must be a number of seconds > 0, got {deadline!r}", "invalid_args")
        asked = _asked_slice(budget)
        child_tools = _subset(seam.tools, tools)
        parent = engine.get(ctx.run_id)
        child_id, existing = await _child_to_run(engine, ctx.run_id, ctx.step_id, goal)
        if existing is not None and existing.status == "succeeded":  # finished before an interruption: reuse it
            if not any(c.get("run") == child_id for c in parent.state.model_calls):  # its spend not counted yet
                done = JournaledLimits.from_events(await engine.journal.read(child_id))
                if seam.budget is not None:
                    seam.budget.settle(seam.budget.reserve(0.0, 0), done.spent_usd, done.spent_tokens)
                _report_spend(ctx, done.model or "", child_id, done.spent_usd, done.spent_tokens)
            return {"answer": existing.answer, "summary": _summary(child_id, existing, existing.answer),
                    "run": child_id}
        now = engine.clock.now()
        deadline_at = seam.deadline_at
        if deadline_at is None:  # the parent's own end as journaled at its start (kept across a resume)
            deadline_at = JournaledLimits.from_events(await engine.journal.read(ctx.run_id)).deadline_at
        left = None if deadline_at is None else max(0.0, deadline_at - now)
        if existing is not None:  # resumed: the limits it was started with, what it spent already charged
            recorded = JournaledLimits.from_events(await engine.journal.read(child_id))
            limits, child_budget = recorded.limits, recorded.budget()
            remaining = recorded.remaining_s(now)
            share = BudgetSlice(limits.budget_usd, limits.budget_tokens)
            child_deadline = remaining if left is None else (left if remaining is None else min(left, remaining))
        else:
            steps = parent.plan.steps
            open_children = sum(1 for sid, rec in parent.state.records.items()
                                if sid in steps and steps[sid].tool == SUBPLAN_TOOL
                                and rec.status in ("pending", "ready", "running"))
            share = slice_budget(asked, None if seam.budget is None else seam.budget.remaining_usd,
                                 None if seam.budget is None else seam.budget.remaining_tokens, open_children)
            child_deadline = deadline if left is None else (left if deadline is None else min(deadline, left))
            limits = RunLimits(share.usd, share.tokens, child_deadline, seam.max_replans)
            child_budget = limits.budget()
        reservation = _reserve(seam.budget, share, child_id)
        loop = seam.build(child_tools, RunLimits(limits.budget_usd, limits.budget_tokens, child_deadline,
                                                 limits.max_replans), child_budget, depth,
                          {"run": ctx.run_id, "step": ctx.step_id, "depth": depth})
        try:
            child = await (loop.resume(child_id) if existing is not None else loop.start(goal, run_id=child_id,
                                                                                       priority=parent.priority))
        except BaseException:
            _settle(seam.budget, reservation, 0.0, 0)
            raise
        stop = _propagate_cancel(parent, ctx.step_id, child)
        child.subscribe(lambda _event: ctx.heartbeat())  # the child's progress keeps a `heartbeat:` step alive
        try:
            result = await child.wait()
        except BaseException:
            if not stop.cancelled and not child.finished:
                engine.interrupt(child_id)  # the parent was interrupted, not cancelled: the child stays resumable
            raise
        finally:
            stop.active = False
            # All it spent, from its journaled calls (a resumed child's state holds those before the interruption
            # too, as its budget was charged with them).
            usd, tokens = child.state.cost_usd, child.state.tokens
            _settle(seam.budget, reservation, usd, tokens)
            _report_spend(ctx, loop.client.model, child_id, usd, tokens)
        if result.status != "succeeded":
            raise _fail(f"sub-plan run '{child_id}' {result.status}: {result.error or 'no answer'}")
        answer = result.state.answer
        return {"answer": answer, "summary": _summary(child_id, result.state, answer), "run": child_id}

    return Tool.from_function(plan, name=SUBPLAN_TOOL, idempotent=True, speculate=False)


def _report_spend(ctx: StepContext, model: str, child_id: str, usd: float, tokens: int) -> None:
    """Journal what child ``child_id`` spent as a ``model_call`` of the parent's step (``purpose: subplan``): the
    parent's tokens and cost count its tree, and a resumed parent's budget is charged with it."""
    if usd or tokens:
        ctx.report_usage({"purpose": "subplan", "model": model, "prompt_tokens": 0, "completion_tokens": tokens,
                          "cost_usd": usd, "usage_source": "subplan", "run": child_id})


def _reserve(budget: Budget | None, share: BudgetSlice, child_id: str) -> Reservation | None:
    if budget is None:
        return None
    try:
        return budget.reserve(share.usd or 0.0, share.tokens or 0)
    except BudgetExceeded as exc:
        raise _fail(f"plan: the budget slice of sub-plan '{child_id}' does not fit in the parent's budget: {exc}",
                    "budget") from None


def _settle(budget: Budget | None, reservation: Reservation | None, usd: float, tokens: int) -> None:
    """Settle a child's slice with what it spent: the rest of the slice goes back to the parent."""
    if budget is not None and reservation is not None:
        budget.settle(reservation, usd, tokens)


def _subset(tools: Toolbox, names: list[str] | None) -> Toolbox:
    """The tools a child may call: the ones ``names`` names (default: all the parent's). ``llm`` (on the child's
    own budget) and ``plan`` (within the depth limit) are the child's whatever it is given."""
    if names is None:
        return Toolbox({n: t for n, t in tools.items() if n != SUBPLAN_TOOL})
    unknown = [n for n in names if n not in tools and n not in ("llm", SUBPLAN_TOOL, "context.read")]
    if unknown:
        raise _fail(f"plan: unknown tool(s) {unknown} for the sub-plan: the parent has "
                    f"{sorted(n for n in tools if n != SUBPLAN_TOOL)}", "invalid_args")
    return Toolbox({n: tools[n] for n in names if n in tools and n != SUBPLAN_TOOL})


async def _child_to_run(engine: Engine, parent: str, step: str, goal: str) -> tuple[str, RunState | None]:
    """The child run this call is about: the latest one of the step that has not ended (to resume) or that
    succeeded on the same goal (to reuse), with its journaled state; else the id of a new one (and None)."""
    attempt = 1
    last: tuple[str, RunState] | None = None
    while True:
        cid = child_run_id(parent, step, attempt)
        events = await engine.journal.read(cid)
        if not events:
            break
        if engine.seal is not None:
            events = engine.seal.unseal(events)
        last = (cid, RunState.from_events(cid, events))
        attempt += 1
    if last is not None:
        cid, state = last
        if state.plan.spec.goal == goal and (state.status == "succeeded" or (
                state.status == "running" and state.failed_by is None)):
            try:
                engine.get(cid)
            except RunError:
                return cid, state
            raise _fail(f"plan: sub-plan run '{cid}' is already running in this engine")
    return child_run_id(parent, step, attempt), None


@dataclass
class _CancelLink:
    active: bool = True
    cancelled: bool = False


def _propagate_cancel(parent: Run, sid: str, child: Run) -> _CancelLink:
    """Cancel ``child`` when ``parent`` is cancelled or its step ``sid`` is (journaled before the step's task is
    cancelled, so the child is cancelled, not left interrupted)."""
    link = _CancelLink()

    def listen(event: Event) -> None:
        if not link.active or child.finished:
            return
        if (event.kind == "run_cancelled" and event.step is None) or (
                event.kind == "step_cancelled" and event.step == sid):
            link.cancelled = True
            reason = str(event.data.get("reason") or "cancelled")
            if event.step is None and event.data.get("status") == "failed":
                child.fail(f"parent run '{parent.id}' ended: {reason}")
            else:
                child.cancel(f"parent run '{parent.id}' cancelled: {reason}")

    parent.subscribe(listen)
    return link
