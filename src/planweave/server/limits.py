"""The limits of one run submitted over HTTP, the server-wide caps that bound them, and the server's model.

A request to ``POST /runs`` may give ``budget_usd``, ``budget_tokens``, ``deadline`` and ``max_replans``;
``planweave serve --max-budget-usd/--max-budget-tokens/--max-deadline/--max-replans`` set caps that no request can
exceed: a request above a cap is refused (422 naming the cap), a request without a value gets the cap.

A run's limits are journaled in its ``run_created`` (``options.limits``, see :meth:`RunLimits.journaled`), so a
resume (``planweave resume``, a server's recovery, ``POST /runs/{id}/resume``) applies them again: the deadline
stays the absolute time it was, and the budget is what is left after the run's journaled ``model_call`` usage.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from planweave.engine.events import Event
from planweave.engine.runtime import Engine, Run, cancel_at_deadline
from planweave.errors import PlanInvalid, PlanProblem
from planweave.server.live import ServerError
from planweave.tools.registry import Toolbox

if TYPE_CHECKING:
    from planweave.models import Budget, ModelClient

T = TypeVar("T")

__all__ = ["CAP_FLAGS", "JournaledLimits", "LimitCaps", "RunLimits", "ServerModel", "open_server_model",
           "resume_within_limits"]

#: The ``planweave serve`` flag that sets each cap, by the request field it bounds.
CAP_FLAGS = {
    "budget_usd": "--max-budget-usd",
    "budget_tokens": "--max-budget-tokens",
    "deadline": "--max-deadline",
    "max_replans": "--max-replans",
}


@dataclass(frozen=True)
class RunLimits:
    """What one run may spend and how long it may take (None: unlimited, or the planning loop's default)."""

    budget_usd: float | None = None
    budget_tokens: int | None = None
    deadline: float | None = None
    max_replans: int | None = None

    def budget(self) -> Budget | None:
        """A fresh :class:`~planweave.models.Budget` for the run's model calls, or None without a budget."""
        if self.budget_usd is None and self.budget_tokens is None:
            return None
        from planweave.models import Budget

        return Budget(usd=self.budget_usd, tokens=self.budget_tokens)

    def journaled(self, now: float, model: str | None = None) -> dict[str, Any]:
        """These limits as ``run_created`` keeps them (``options.limits``): the deadline also as the absolute time
        ``deadline_at`` (``now`` on the engine's clock plus the deadline), and the model the run's ``llm`` calls."""
        record: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(RunLimits)}
        record["deadline_at"] = None if self.deadline is None else now + self.deadline
        record["model"] = model
        return record


@dataclass(frozen=True)
class JournaledLimits:
    """The limits a run was started with, read back from its journal, and what it has spent of them since."""

    limits: RunLimits
    deadline_at: float | None = None  # the absolute end on the engine's clock (seconds since the epoch)
    model: str | None = None  # the model its llm steps called
    spent_usd: float = 0.0
    spent_tokens: int = 0

    @staticmethod
    def from_events(events: Sequence[Event]) -> JournaledLimits:
        """The limits of ``run_created`` (none for runs journaled without them) and the usage of every
        ``model_call``."""
        record: Mapping[str, Any] = {}
        usd, tokens = 0.0, 0
        for event in events:
            if event.kind == "run_created":
                record = (event.data.get("options") or {}).get("limits") or {}
            elif event.kind == "model_call":
                usd += float(event.data.get("cost_usd") or 0.0)
                tokens += int(event.data.get("prompt_tokens") or 0) + int(event.data.get("completion_tokens") or 0)
        limits = RunLimits(**{f.name: record.get(f.name) for f in fields(RunLimits)})
        return JournaledLimits(limits, record.get("deadline_at"), record.get("model"), usd, tokens)

    def with_overrides(self, overrides: RunLimits, now: float) -> JournaledLimits:
        """These limits with the ones given again at resume (a new deadline counts from ``now``)."""
        limits = RunLimits(**{f.name: _or(getattr(overrides, f.name), getattr(self.limits, f.name))
                              for f in fields(RunLimits)})
        deadline_at = self.deadline_at if overrides.deadline is None else now + overrides.deadline
        return replace(self, limits=limits, deadline_at=deadline_at)

    def remaining_s(self, now: float) -> float | None:
        """Seconds left until the deadline at ``now`` (0 once it passed), or None without a deadline."""
        if self.deadline_at is None or not math.isfinite(self.deadline_at):
            return None
        return max(0.0, self.deadline_at - now)

    def budget(self) -> Budget | None:
        """A :class:`~planweave.models.Budget` of the run's limits with what the run spent already charged."""
        budget = self.limits.budget()
        if budget is not None and (self.spent_usd or self.spent_tokens):
            budget.settle(budget.reserve(0.0, 0), self.spent_usd, self.spent_tokens)
        return budget

    def apply_deadline(self, engine: Engine, run: Run) -> None:
        """Cancel ``run`` when the deadline it was started with passes (at once if it passed while it was down)."""
        remaining = self.remaining_s(engine.clock.now())
        if remaining is not None:
            cancel_at_deadline(engine, run, remaining)


def _or(value: T | None, default: T | None) -> T | None:
    return default if value is None else value


@dataclass(frozen=True)
class LimitCaps:
    """Server-wide caps on :class:`RunLimits` (None: no cap on that limit); a deadline cap must be above 0."""

    budget_usd: float | None = None
    budget_tokens: int | None = None
    deadline: float | None = None
    max_replans: int | None = None

    def __post_init__(self) -> None:
        if self.deadline is not None and not self.deadline > 0:  # also NaN: every run would end at once
            raise ServerError(f"{CAP_FLAGS['deadline']} must be above 0 seconds, got {self.deadline:g}")

    def bound(self, requested: RunLimits, source: str) -> RunLimits:
        """``requested`` with every missing limit set to its cap; raises PlanInvalid naming each exceeded cap."""
        problems = [
            PlanProblem("", f.name, f"{getattr(requested, f.name):g} is above this server's cap of "
                                    f"{getattr(self, f.name):g} (planweave serve {CAP_FLAGS[f.name]})")
            for f in fields(RunLimits)
            if getattr(self, f.name) is not None and getattr(requested, f.name) is not None
            and getattr(requested, f.name) > getattr(self, f.name)
        ]
        if problems:
            raise PlanInvalid(problems, source)
        return RunLimits(
            budget_usd=_or(requested.budget_usd, self.budget_usd),
            budget_tokens=_or(requested.budget_tokens, self.budget_tokens),
            deadline=_or(requested.deadline, self.deadline),
            max_replans=_or(requested.max_replans, self.max_replans),
        )


@dataclass(frozen=True)
class ServerModel:
    """The model of ``planweave serve --model``: goals are planned with it, and plan steps call it as ``llm``.

    Each run gets its own ``llm`` tool bound to that run's budget, so one run cannot spend another's.
    """

    engine: Engine
    client: ModelClient
    base: Toolbox

    def tools(self, budget: Budget | None) -> Toolbox:
        """The engine's tools plus ``llm`` on this model within ``budget`` (a given ``llm`` tool is kept)."""
        from planweave.tools.llm import llm_tool

        if "llm" in self.base:
            return self.base
        return self.base.merged(Toolbox({"llm": llm_tool(self.client, budget)}))

    async def start_plan(self, document: Any, run_id: str | None, source: str, limits: RunLimits) -> Run:
        """Start a plan whose ``llm`` steps spend at most the run's budget (its limits journaled for a resume)."""
        return await self.engine.start(document, tools=self.tools(limits.budget()), run_id=run_id, source=source,
                                       limits=limits.journaled(self.engine.clock.now(), self.client.model))

    async def start_goal(self, goal: str, run_id: str | None, limits: RunLimits) -> Run:
        """Start planning ``goal`` within ``limits`` (the planning loop enforces budget, deadline and re-plans)."""
        from planweave.planning import PlanningLoop, PlanningOptions

        budget = limits.budget()
        options = PlanningOptions(deadline_s=limits.deadline)
        if limits.max_replans is not None:
            options = PlanningOptions(deadline_s=limits.deadline, max_replans=limits.max_replans)
        loop = PlanningLoop(self.engine, self.client, self.tools(budget), budget=budget, options=options)
        return await loop.start(goal, run_id=run_id)


async def open_server_model(
    stack: contextlib.AsyncExitStack, engine: Engine, model: str, base_url: str | None
) -> ServerModel:
    """Open ``model`` for the life of ``stack`` (the server's) and bind it to ``engine``'s tools."""
    from planweave.models import resolve_model
    from planweave.tools import builtin_tools

    client = await stack.enter_async_context(resolve_model(model, **({"base_url": base_url} if base_url else {})))
    base = engine.tools if isinstance(engine.tools, Toolbox) else builtin_tools()
    return ServerModel(engine, client, base)


def start_deadline(engine: Engine, run: Run, limits: RunLimits) -> None:
    """Cancel the plan run ``run`` when its deadline passes (goal runs have the planning loop's own deadline)."""
    if limits.deadline is not None:
        cancel_at_deadline(engine, run, limits.deadline)


async def resume_within_limits(engine: Engine, model: ServerModel | None, run_id: str, *,
                               retry_unknown: bool = False) -> Run:
    """Resume ``run_id`` with the limits it was started with: its ``llm`` steps on this server's model within what
    is left of its budget, and its deadline at the time it was set for."""
    recorded = JournaledLimits.from_events(await engine.journal.read(run_id))
    tools = model.tools(recorded.budget()) if model is not None else None
    run = await engine.resume(run_id, tools=tools, retry_unknown=retry_unknown)
    recorded.apply_deadline(engine, run)
    return run
