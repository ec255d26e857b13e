"""The limits of one run submitted over HTTP, the server-wide caps that bound them, and the server's model.

A request to ``POST /runs`` may give ``budget_usd``, ``budget_tokens``, ``deadline`` and ``max_replans``;
``planweave serve --max-budget-usd/--max-budget-tokens/--max-deadline/--max-replans`` set caps that no request can
exceed: a request above a cap is refused (422 naming the cap), a request without a value gets the cap.

A run's limits are journaled in its ``run_created`` (:mod:`planweave.limits`), so the server's recovery and
``POST /runs/{id}/resume`` apply them again (:func:`resume_within_limits`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.engine.runtime import Engine, Run, cancel_at_deadline
from planweave.limits import JournaledLimits, RunLimits
from planweave.models.endpoint import Endpoint, EndpointError
from planweave.server.endpoints import EndpointPolicy
from planweave.server.live import ServerError
from planweave.server.prices import refuse_unpriced
from planweave.server.runs import HTTP_SOURCE
from planweave.tools.registry import Toolbox

if TYPE_CHECKING:
    from planweave.allocate import AllocationSeam, TierTable
    from planweave.models import Budget, ModelClient
    from planweave.planning import PlanningLoop

T = TypeVar("T")

#: ``options.limits.origin`` of a goal run started by ``POST /runs`` (its ``source`` is "goal", as the CLI's).
GOAL_ORIGIN = HTTP_SOURCE

__all__ = ["CAP_FLAGS", "GOAL_ORIGIN", "JournaledLimits", "LimitCaps", "RunLimits", "ServerModel", "checked_tiers",
           "open_server_model", "resume_within_limits"]

#: The ``planweave serve`` flag that sets each cap, by the request field it bounds.
CAP_FLAGS = {
    "budget_usd": "--max-budget-usd",
    "budget_tokens": "--max-budget-tokens",
    "deadline": "--max-deadline",
    "max_replans": "--max-replans",
}


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

    Each run gets its own ``llm`` tool bound to that run's budget, so one run cannot spend another's. ``endpoint``
    is the one ``client`` was opened on (``serve --base-url/--api-key-env/--header``); a run asking for another
    (``POST /runs`` ``endpoint``, its tiers' ``base_url``) gets clients of its own, within ``policy``, closed when it
    ends (:meth:`on_endpoint`).
    """

    engine: Engine
    client: ModelClient
    base: Toolbox
    endpoint: Endpoint = field(default_factory=Endpoint)
    policy: EndpointPolicy = field(default_factory=EndpointPolicy)
    # The endpoint one run asked for (journaled for its resume); None: the server's, whatever it is at a restart.
    asked: Endpoint | None = None

    async def on_endpoint(self, endpoint: Endpoint | None, tiers: TierTable | None = None
                          ) -> tuple[ServerModel, contextlib.AsyncExitStack | None]:
        """This model for one run on ``endpoint`` (its unset parts the server's) and with its tiers on theirs:
        itself when neither asks for anything, else one on clients of its own and the stack that closes them.
        Raises PlanInvalid (422) naming the field for an endpoint the policy refuses or a key variable unset."""
        routes = {} if tiers is None else tiers.endpoints()
        if (endpoint is None or endpoint.over(self.endpoint) == self.endpoint) and not routes:
            return self, None
        for name, tier in ({} if tiers is None else tiers.tiers).items():
            if tier.endpoint is not None:
                self.policy.check(tier.endpoint, f"tiers.{name}")
        from planweave.models import open_routes, resolve_model

        given = self.endpoint if endpoint is None else endpoint.over(self.endpoint)
        from planweave.tools.safety import hide_secrets

        stack = contextlib.AsyncExitStack()
        try:
            client = self.client if given == self.endpoint else await stack.enter_async_context(
                resolve_model(self.client.model, endpoint=given))
            client = await open_routes(stack, client, routes, given)
            for each in (given, *(e.over(given) for e in routes.values())):  # never journaled nor shown
                hide_secrets(self.engine.redact, each.secrets())
        except EndpointError as exc:
            await stack.aclose()
            raise PlanInvalid([PlanProblem("", f"endpoint.{exc.field}", str(exc))], HTTP_SOURCE) from None
        except BaseException:
            await stack.aclose()
            raise
        own = endpoint is None or endpoint.over(self.endpoint) == self.endpoint
        return replace(self, client=client, endpoint=given, asked=None if own else given), stack

    def close_after(self, run: Run, stack: contextlib.AsyncExitStack | None) -> None:
        """Close ``stack`` (a run's own clients) once ``run`` ends, or when the engine closes."""
        if stack is not None:
            self.engine.spawn(_close_when_done(run, stack), name=f"planweave-endpoint-{run.id}")

    def tools(self, budget: Budget | None, allocation: AllocationSeam | None = None) -> Toolbox:
        """The engine's tools plus ``llm`` on this model within ``budget`` (a given ``llm`` tool is kept), its
        ``model: auto`` steps allocated by ``allocation``."""
        from planweave.tools.llm import llm_tool

        if "llm" in self.base:
            return self.base
        return self.base.merged(Toolbox({"llm": llm_tool(self.client, budget, allocation=allocation)}))

    def allocation(self, tiers: TierTable | None, deadline_at: float | None) -> AllocationSeam | None:
        """An allocator on ``tiers`` for one run's ``model: auto`` steps (None without tiers), reading the
        engine's runs, to finish by ``deadline_at`` on its clock."""
        if tiers is None:
            return None
        from planweave.allocate import AllocationSeam
        from planweave.forecast.history import read_estimates

        journal = self.engine.journal  # the tiers fitted from its history, read at the run's first decision
        seam = AllocationSeam(tiers, deadline_at=deadline_at, history=lambda: read_estimates(journal))
        seam.bind(self.engine.get)
        return seam

    async def start_plan(self, document: Any, run_id: str | None, source: str, limits: RunLimits,
                         priority: float = 0.0, *, tiers: TierTable | None = None,
                         pressure: float | None = None, endpoint: Endpoint | None = None) -> Run:
        """Start a plan whose ``llm`` steps spend at most the run's budget, its ``model: auto`` steps allocated from
        ``tiers`` (its limits, tiers and deadline-pressure threshold journaled for a resume), on ``endpoint``
        (checked by the policy; its base URL and key variable journaled, never a key)."""
        refuse_unpriced(self.client, limits.budget_usd, tiers, document)  # 422 before any model call
        model, stack = await self.on_endpoint(endpoint, tiers)
        try:
            run = await model._start_plan(document, run_id, source, limits, priority, tiers=tiers, pressure=pressure)
        except BaseException:
            if stack is not None:
                await stack.aclose()
            raise
        model.close_after(run, stack)
        return run

    async def _start_plan(self, document: Any, run_id: str | None, source: str, limits: RunLimits,
                          priority: float, *, tiers: TierTable | None, pressure: float | None) -> Run:
        now = self.engine.clock.now()
        seam = self.allocation(tiers, None if limits.deadline is None else now + limits.deadline)
        run = await self.engine.start(document, tools=self.tools(limits.budget(), seam), run_id=run_id,
                                      source=source, priority=priority, limits=limits.journaled(
                                          now, self.client.model,
                                          tiers=None if tiers is None else tiers.to_mapping(), pressure=pressure,
                                          **(self.asked.journaled() if self.asked is not None else {})))
        watch_plan(self.engine, run, limits, seam, threshold=pressure)
        return run

    def planning_loop(self, limits: RunLimits, *, context: Literal["references", "summary"] | None = None,
                      subplans: bool = True, origin: str | None = None,
                      pressure: float | None = None) -> PlanningLoop:
        """The planning loop of one goal run within ``limits``: :func:`planweave.planning.build_planning_loop`, as
        ``planweave goal`` builds it (the same budget, deadline, re-plans and planning options; ``context``
        and ``subplans`` as its --context and --no-subplans)."""
        from planweave.planning import build_planning_loop

        return build_planning_loop(self.engine, self.client, self.base, limits, context=context, subplans=subplans,
                                   endpoint=self.asked, origin=origin, pressure=pressure)

    async def start_goal(self, goal: str, run_id: str | None, limits: RunLimits, priority: float = 0.0, *,
                         context: Literal["references", "summary"] | None = None, subplans: bool = True,
                         pressure: float | None = None, endpoint: Endpoint | None = None) -> Run:
        """Start planning ``goal`` within ``limits`` (the planning loop enforces budget, deadline and re-plans).

        With a deadline or a dollar budget the run's live forecast runs (the dashboard shows it), as a posted
        plan's does; with a deadline and ``pressure`` (journaled for a resume), a forecast below that chance of
        ending in time makes the planner re-plan with the time left, as ``planweave goal
        --config deadline_pressure=P`` does."""
        refuse_unpriced(self.client, limits.budget_usd)  # 422 before the planner's first call
        model, stack = await self.on_endpoint(endpoint)
        try:
            run = await model._start_goal(goal, run_id, limits, priority, context=context, subplans=subplans,
                                          pressure=pressure)
        except BaseException:
            if stack is not None:
                await stack.aclose()
            raise
        model.close_after(run, stack)
        return run

    async def _start_goal(self, goal: str, run_id: str | None, limits: RunLimits, priority: float, *,
                          context: Literal["references", "summary"] | None, subplans: bool,
                          pressure: float | None) -> Run:
        from planweave.planning.goal import launch_goal

        # origin journaled: this server's recovery resumes it (RunIndex.orphans)
        loop = self.planning_loop(limits, context=context, subplans=subplans, origin=GOAL_ORIGIN, pressure=pressure)
        return await launch_goal(loop, goal, run_id=run_id, priority=priority)

    async def resume_goal(self, run_id: str, recorded: JournaledLimits, *, retry_unknown: bool = False) -> Run:
        """Resume the goal run ``run_id`` with its planning loop rebuilt from the journal, as ``planweave resume RUN
        --model M`` does: its limits (what is left of its budget, the time left until its deadline, its re-plans),
        its planner's journaled tiers (--cascade) and its context and sub-plans; the loop re-plans on failures and
        the joiner answers. Raises PlanInvalid (422) naming the run for journaled modes this version cannot read."""
        from planweave.planning import build_planning_loop

        try:
            context, subplans = recorded.planning_modes(run_id)
        except ValueError as exc:
            raise PlanInvalid([PlanProblem("", "context", str(exc))], f"run '{run_id}'") from None
        tiers = checked_tiers(recorded.tiers, where=f"run '{run_id}': its journaled tiers") \
            if recorded.cascade else None
        kept = recorded.limits
        limits = RunLimits(kept.budget_usd, kept.budget_tokens, recorded.remaining_s(self.engine.clock.now()),
                           kept.max_replans)
        model, stack = await self.on_endpoint(journaled_endpoint(recorded, run_id, self.policy))
        loop = build_planning_loop(self.engine, model.client, self.base, limits, budget=recorded.budget(),
                                   tiers=tiers, context=context, subplans=subplans, endpoint=model.asked,
                                   origin=recorded.origin, pressure=recorded.pressure)
        try:
            run = await loop.resume(run_id, retry_unknown=retry_unknown)
        except BaseException:
            if stack is not None:
                await stack.aclose()
            raise
        model.close_after(run, stack)
        # Its live forecast again, and the deadline pressure it was started with (the planner re-plans under it).
        _forecast_goal(self.engine, run, loop, recorded.deadline_at, kept.budget_usd, recorded.pressure)
        return run


def _forecast_goal(engine: Engine, run: Run, loop: PlanningLoop, deadline_at: float | None,
                   budget_usd: float | None, pressure: float | None) -> None:
    """A goal run's live forecast (with a deadline at ``deadline_at`` or a dollar budget) and, with a deadline and
    a ``pressure`` threshold, its deadline pressure: re-plans by ``loop``, started in the same loop turn."""
    from planweave.allocate.pressure_watch import forecast_and_watch

    forecast_and_watch(engine, run, deadline_at=deadline_at, budget_usd=budget_usd, threshold=pressure,
                       planner=loop)


def journaled_endpoint(recorded: JournaledLimits, run_id: str, policy: EndpointPolicy) -> Endpoint:
    """The endpoint ``run_id`` journaled (base URL, key variable), still within ``policy`` (else 422 naming it)."""
    endpoint = Endpoint.from_journal({"base_url": recorded.base_url, "api_key_env": recorded.api_key_env})
    try:
        policy.check(endpoint, "endpoint")
    except PlanInvalid as exc:
        raise PlanInvalid(exc.problems, f"run '{run_id}'") from None
    return endpoint


async def _close_when_done(run: Run, stack: contextlib.AsyncExitStack) -> None:
    async with stack:
        with contextlib.suppress(Exception):
            await run.wait()


async def open_server_model(
    stack: contextlib.AsyncExitStack, engine: Engine, model: str, base_url: str | None, *,
    endpoint: Endpoint | None = None, policy: EndpointPolicy | None = None,
) -> ServerModel:
    """Open ``model`` for the life of ``stack`` (the server's) on ``endpoint`` (``base_url`` in it) and bind it to
    ``engine``'s tools; runs may ask for the other endpoints ``policy`` allows (default: only this one)."""
    endpoint = replace(endpoint or Endpoint(), base_url=base_url or (endpoint.base_url if endpoint else None))
    policy = policy if policy is not None else EndpointPolicy.of(endpoint)
    from planweave.models import resolve_model
    from planweave.tools import builtin_tools

    client = await stack.enter_async_context(resolve_model(model, endpoint=endpoint))
    base = engine.tools if isinstance(engine.tools, Toolbox) else builtin_tools()
    from planweave.tools.safety import hide_secrets

    hide_secrets(engine.redact, endpoint.secrets())
    return ServerModel(engine, client, base, endpoint, policy)


def checked_tiers(doc: Any, *, where: str = "tiers") -> TierTable | None:
    """The tier table ``doc`` (a request's ``tiers``, a journaled one) checked, or None without one; raises
    PlanInvalid (422) naming ``where``, the tier and the field."""
    if doc is None:
        return None
    from planweave.allocate import AllocationError, TierTable

    try:
        return TierTable.from_mapping(doc, where=where)
    except AllocationError as exc:
        raise PlanInvalid([PlanProblem("", "tiers", str(exc))], "POST /runs" if where == "tiers" else where) \
            from None


def watch_plan(engine: Engine, run: Run, limits: RunLimits, seam: AllocationSeam | None = None, *,
               threshold: float | None = None) -> None:
    """A posted plan run's live forecast (with a deadline or a dollar budget: the dashboard shows it) and, with a
    deadline, the deadline pressure its plan's ``pressure:`` or the request's ``threshold`` (``deadline_pressure``,
    in place of the plan's ``p_deadline``) asks for; ``seam``: the allocator its ``faster_tiers`` hurries."""
    created = run.state.created_at
    deadline_at = None if limits.deadline is None or created is None else created + limits.deadline
    from planweave.allocate.pressure_watch import forecast_and_watch

    forecast_and_watch(engine, run, deadline_at=deadline_at, budget_usd=limits.budget_usd, threshold=threshold,
                       seam=seam)


def start_deadline(engine: Engine, run: Run, limits: RunLimits) -> None:
    """Cancel the plan run ``run`` when its deadline passes (goal runs have the planning loop's own deadline)."""
    if limits.deadline is not None:
        cancel_at_deadline(engine, run, limits.deadline)


async def resume_within_limits(engine: Engine, model: ServerModel | None, run_id: str, *,
                               retry_unknown: bool = False) -> Run:
    """Resume ``run_id`` with the limits it was started with: its ``llm`` steps on this server's model within what
    is left of its budget, and its deadline at the time it was set for."""
    events = await engine.journal.read(run_id)
    recorded = JournaledLimits.from_events(events)
    if events and events[0].data.get("source") == "goal":  # its planner and joiner again, on this server's model
        if model is None:
            raise PlanInvalid([PlanProblem("", "model", "this server has no model to plan goals with: start it with "
                                                        "`planweave serve --model NAME`")], f"run '{run_id}'")
        return await model.resume_goal(run_id, recorded, retry_unknown=retry_unknown)
    tools = None
    seam = None
    stack: contextlib.AsyncExitStack | None = None
    if model is not None:
        tiers = checked_tiers(recorded.tiers, where=f"run '{run_id}': its journaled tiers")
        model, stack = await model.on_endpoint(journaled_endpoint(recorded, run_id, model.policy), tiers)
        seam = model.allocation(tiers, recorded.deadline_at)
        tools = model.tools(recorded.budget(), seam)
    try:
        run = await engine.resume(run_id, tools=tools, retry_unknown=retry_unknown)
    except BaseException:
        if stack is not None:
            await stack.aclose()
        raise
    if model is not None:
        model.close_after(run, stack)
    recorded.apply_deadline(engine, run)
    from planweave.allocate.pressure_watch import forecast_and_watch

    # Its live forecast again (the dashboard's), and the deadline pressure its plan (or --deadline-pressure) asks.
    forecast_and_watch(engine, run, deadline_at=recorded.deadline_at, budget_usd=recorded.limits.budget_usd,
                       threshold=recorded.pressure, seam=seam)
    return run
