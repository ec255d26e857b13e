"""``planweave run`` and ``planweave resume``: a plan file or a ``--goal``, and continuing a run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

import typer

from planweave.cli.common import (
    PANEL_MODEL,
    PANEL_OUTPUT,
    PANEL_SCHEDULING,
    AllowExecOption,
    Confinement,
    JournalOption,
    JsonOption,
    McpOption,
    ToolsOption,
    UsageError,
    VirtualOption,
    WorkdirOption,
    clean_errors,
    journal_file_missing,
    load_tools,
    parse_capacities,
)
from planweave.cli.executor_flags import ExecutorFlags
from planweave.cli.follow import (
    Limits,
    Outcome,
    Session,
    console_for,
    follow_run,
    report_outcome,
    run_loop,
    tool_output_to_stderr,
)
from planweave.cli.price_flags import called_models, require_priced
from planweave.cli.run_config import ConfigOption, LoadedConfig, config_access, load_config, use_config_files
from planweave.cli.speculation_flags import open_predictor, resumed_speculation, with_predictor
from planweave.core.errors import PlanInvalid, RunNotFound
from planweave.core.events import Event
from planweave.core.plan.defaults import check_seconds, with_default_timeout
from planweave.core.plan.graph import Plan, validate_plan
from planweave.engine.runtime import (
    DEFAULT_CONCURRENCY,
    Engine,
    Run,
)
from planweave.engine.speculative import resolve_policy
from planweave.journal import Journal, default_journal_url, redact_url
from planweave.limits import JournaledLimits, RunLimits
from planweave.planfile import load_plan_file
from planweave.tools import Toolbox

if TYPE_CHECKING:
    from planweave.allocate import AllocationSeam
    from planweave.allocate.cascade_seam import CascadeSeam
    from planweave.allocate.model import TierTable
    from planweave.core.plan.model import PlanSpec, SpeculationMode
    from planweave.forecast.estimates import Estimates
    from planweave.models import Budget, Endpoint
    from planweave.planning import PlanningLoop


@dataclass(frozen=True)
class AgentFlags:
    """The model, budget and limits of a ``--goal`` run (or of resuming one)."""

    model: str
    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None
    deadline: float | None
    max_replans: int
    plan_max_tokens: int
    ask_human: bool = False  # the ladder's last rung asks a person (human.input) instead of failing the run
    tiers: TierTable | None = None  # --tiers with --cascade: the planner (and model: cascade steps) cascade on them
    draft_model: str | None = None  # --draft-model: drafts plans and re-plans ahead of the planner (planning/draft.py)
    planner_auto: bool = False  # --model auto --tiers FILE: the planner's tier chosen before each call (Monte Carlo)
    context: ContextMode | None = None  # --context: what the planner sees of the run (None: the loop's default)
    subplans: bool = True  # --no-subplans: no `plan` tool, so no step runs a child run
    access: Endpoint | None = None  # --api-key-env and --header (its base_url: base_url above)
    plan_via: Literal["auto", "tools", "text"] | None = None  # config plan_via: add_step calls or JSON Lines

    @property
    def endpoint(self) -> Endpoint:
        """--base-url, --api-key-env and --header together."""
        return _endpoint(self.base_url, self.access)

    async def planning_loop(self, engine: Engine, stack: AsyncExitStack, toolbox: Toolbox,
                            budget: Budget | None = None, *, pressure: float | None = None,
                            recall: Callable[[str], Awaitable[str]] | None = None) -> PlanningLoop:
        """A :class:`planweave.planning.PlanningLoop` on a client opened for the life of ``stack``, with ``llm``
        (spending ``budget`` if given: a resumed run's, charged with what it spent; else a fresh one)."""
        from planweave.models import open_routes, resolve_model
        from planweave.planning import build_planning_loop

        endpoint = self.endpoint
        model = self.model
        if self.planner_auto and self.tiers is not None:  # the client's own model: the cheapest tier's
            model = min(self.tiers.tiers.values(), key=lambda t: (t.cost_usd, t.name)).model
        from planweave.tools.safety import hide_secrets

        hide_secrets(engine.redact, endpoint.secrets())  # its key and headers' values: never journaled nor shown
        client = await stack.enter_async_context(resolve_model(model, endpoint=endpoint))
        if self.tiers is not None:  # tiers on endpoints of their own: each model's calls go there
            for tier in self.tiers.endpoints().values():
                hide_secrets(engine.redact, tier.over(endpoint).secrets())
            client = await open_routes(stack, client, self.tiers.endpoints(), endpoint)
        draft = None if self.draft_model is None else \
            await stack.enter_async_context(resolve_model(self.draft_model, endpoint=endpoint))
        base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
        limits = self.limits()
        spend = budget if budget is not None else limits.budget()  # the loop's budget, the allocation's too
        planner = None
        if self.planner_auto and self.tiers is not None:
            from planweave.allocate.planner_alloc import PlannerAllocation

            deadline_at = None if self.deadline is None else engine.clock.now() + self.deadline
            planner = PlannerAllocation(self.tiers, budget=spend, deadline_at=deadline_at,
                                        history=_history(engine), now=engine.clock.now)
        return build_planning_loop(engine, client, base, limits, plan_max_tokens=self.plan_max_tokens,
                                   ask_human=self.ask_human, budget=spend, tiers=self.tiers, draft=draft,
                                   context=self.context, subplans=self.subplans,
                                   endpoint=endpoint if not endpoint.default else None, pressure=pressure,
                                   memory=recall, planner=planner, plan_via=self.plan_via)

    def limits(self) -> RunLimits:
        """The run's limits as the server gets them from a request (a zero budget is a budget)."""
        return RunLimits(self.budget_usd, self.budget_tokens, self.deadline, self.max_replans)


DEFAULT_GOAL_MODEL = "gpt-4o-mini"

ContextMode = Literal["references", "summary"]


def check_model_name(model: str | None) -> None:
    """A ``scripted:FILE`` model whose script cannot be used: exit 2 naming the file, before any run starts."""
    if model is not None and model.startswith("scripted:"):
        from planweave.testing.scripted_planner import ScriptedPlanner

        ScriptedPlanner.load(model.removeprefix("scripted:"))


def _endpoint(base_url: str | None, access: Endpoint | None) -> Endpoint:
    from planweave.models.endpoint import Endpoint

    return replace(access or Endpoint(), base_url=base_url)


def recorded_endpoint(recorded: JournaledLimits) -> Endpoint:
    """The endpoint a run journaled: its base URL and the name of its key's variable (headers are given again)."""
    from planweave.models.endpoint import Endpoint

    return Endpoint.from_journal({"base_url": recorded.base_url, "api_key_env": recorded.api_key_env})


def journaled_endpoint(base_url: str | None) -> str | None:
    """The ``--base-url`` a run journals for a resume to call again: None for a URL that may carry a credential (a
    user or password, a query), which stays out of the journal (the resume is given it again)."""
    if not base_url:
        return None
    parts = urlsplit(base_url)
    return None if "@" in parts.netloc or parts.query else base_url


def _resume_flags(workdir: Path, allow_exec: list[str] | None, base_url: str | None, *more: str) -> tuple[str, ...]:
    """The flags of this command line a resume of its run must repeat, the journal not keeping them: the jail, the
    endpoint (``--base-url`` when not journaled, its password as ``***``: never a key) and ``more`` (its --config
    arguments: the rest of the jail, the executor, cache...)."""
    flags: list[str] = [] if workdir == Path(".") else ["--workdir", str(workdir)]
    for value in allow_exec or ():
        flags += ["--allow-exec", str(value)]
    if base_url:
        flags += ["--base-url", redact_url(base_url)]
    return (*flags, *more)


def _goal_model(run_id: str, events: list[Event]) -> str | None:
    """The model a --goal run was started with, for a resume not given ``--model`` (None: not a --goal run); a goal
    run journaled without its model: exit 2 asking for it."""
    if not events or events[0].data.get("source") != "goal":
        return None
    model = JournaledLimits.from_events(events).model
    if model is None:
        raise UsageError(f"run '{run_id}' is a --goal run whose model is not in the journal: resume it with --model "
                         "NAME (and --base-url URL if it is not $OPENAI_BASE_URL) to re-attach its model, planner "
                         "and llm tool")
    return model


def _without_tools(run_id: str, exc: PlanInvalid) -> Exception:
    """A resume refused for tools this command was not given: said so, with what gives them (exit 2)."""
    if not any("unknown tool" in str(p) for p in exc.problems):
        return exc
    return UsageError(f"{exc}\n(run '{run_id}' calls tools this command was not given: resume it with the --tools "
                      "and --mcp it was run with, as the 'resume with:' line it printed says)")


def _resume_mode_flags(run_id: str, model: str | None, ask_human: bool, max_replans: int | None,
                       config: LoadedConfig) -> None:
    """The flags and config keys of ``resume`` that apply to one kind of run only, checked against the run's kind
    (``model``: the model a goal run is resumed with; None: a plan-file run): exit 2 naming the flag or key."""
    for flag, given in (("--ask-human", ask_human), ("--max-replans", max_replans is not None)):
        if given and model is None:
            raise UsageError(f"{flag} applies to a goal run resumed with its planner, and run '{run_id}' runs a "
                             "plan file: leave it out (or give --model NAME to plan with one)")
    if model is None:
        return
    # A goal run's tiers are journaled (speculation never applies to it): the config file it was started with, given
    # again, is read without them; a KEY=VALUE pair given for this resume asks for something it cannot do.
    for key in ("tiers", "speculate", "predictor_model"):
        if getattr(config.values, key) is not None and config.sources.get(key, "").startswith("--config "):
            raise UsageError(f"{config.where(key)} applies to plan files: run '{run_id}' is a goal run, whose steps "
                             "its planner writes (its tiers are journaled)")


def _journaled_modes(run_id: str, recorded: JournaledLimits) -> tuple[ContextMode | None, bool]:
    """The context and sub-plans a resumed --goal run was started with (None, True: journaled before they were,
    today's defaults); a journaled context this version does not know: exit 2 naming the run."""
    try:
        return recorded.planning_modes(run_id)  # the read model a server's resume uses too
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class PlanModel:
    """The model a plan file's ``llm`` steps call (``run plan.yaml --model M``), within an optional budget."""

    model: str
    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None
    allocation: AllocationSeam | None = None  # --tiers: the allocator for model: auto steps
    cascade: CascadeSeam | None = None  # --tiers: the cascade of model: cascade steps (--cascade: model: auto too)
    access: Endpoint | None = None  # --api-key-env and --header (its base_url: base_url above)

    @property
    def endpoint(self) -> Endpoint:
        """--base-url, --api-key-env and --header together."""
        return _endpoint(self.base_url, self.access)

    @staticmethod
    def from_flags(
        model: str | None, base_url: str | None, budget_usd: float | None, budget_tokens: int | None,
        access: Endpoint | None = None, config: LoadedConfig | None = None,
    ) -> PlanModel | None:
        """The model of a plan-file run, or None without ``--model``; raises UsageError naming a flag (or config
        key) that applies to that model only (it would be silently ignored otherwise)."""
        if model is None:
            keyed = "api_key_env" if config is not None and config.values.api_key_env is not None else "headers"
            for flag, given in (("--base-url", base_url), ("--budget-usd", budget_usd),
                                ("--budget-tokens", budget_tokens),
                                (config.where(keyed) if config is not None else "--config", access)):
                if given is not None:
                    raise UsageError(f"{flag} applies to the model that a plan file's llm steps call: give "
                                     "--model NAME too")
            return None
        return PlanModel(model, base_url, budget_usd, budget_tokens, access=access)

    async def toolbox(self, stack: AsyncExitStack, tools: Toolbox, budget: Budget | None,
                      redact: object = None) -> Toolbox:
        """``tools`` plus ``llm`` on this model (opened for the life of ``stack``), spending at most ``budget``; the
        endpoints' keys and headers' values hidden by ``redact`` (the engine's)."""
        from planweave.models import open_routes, resolve_model
        from planweave.tools.llm import llm_tool
        from planweave.tools.safety import hide_secrets

        hide_secrets(redact, self.endpoint.secrets())
        for tier in ({} if self.allocation is None else self.allocation.table.endpoints()).values():
            hide_secrets(redact, tier.over(self.endpoint).secrets())

        client = await stack.enter_async_context(resolve_model(self.model, endpoint=self.endpoint))
        if self.allocation is not None:  # tiers on endpoints of their own: each model's calls go there
            client = await open_routes(stack, client, self.allocation.table.endpoints(), self.endpoint)
        return tools if "llm" in tools else tools.merged(Toolbox({"llm": llm_tool(
            client, budget, allocation=self.allocation, cascade=self.cascade)}))


def _plan_models(plan_model: PlanModel | None, predictor_model: str | None, spec: PlanSpec) -> list[str]:
    """The models a plan file's run calls within its budget (a dollar budget bounds only models with a price):
    --model and its --tiers' when a step (or a fallback) is ``llm``, and --predictor-model."""
    if plan_model is None:
        return []
    from planweave.models.pricing import calls_llm

    table = None if plan_model.allocation is None else plan_model.allocation.table
    return called_models(plan_model.model if calls_llm(spec.steps) else None,
                         table if calls_llm(spec.steps) else None, predictor_model)


async def _plan_tools(plan_model: PlanModel | None, stack: AsyncExitStack, base: Toolbox,
                      budget: Budget | None, redact: object = None) -> Toolbox | None:
    """A plan-file run's tools: ``base`` and ``llm`` on its model (None without --model: the engine's)."""
    return None if plan_model is None else await plan_model.toolbox(stack, base, budget, redact)


def _with_tiers(plan_model: PlanModel | None, config: LoadedConfig) -> PlanModel | None:
    """``plan_model`` with an allocator and a cascade on the config's tier table if it names one (bad file, or no
    --model: exit 2 naming the key); ``cascade``: its ``model: auto`` steps are cascaded rather than allocated."""
    path = None if config.values.tiers is None else Path(config.values.tiers)
    cascade = bool(config.values.cascade)
    if path is None:
        if cascade:
            raise UsageError(f"{config.where('cascade')} needs the tiers to cascade over: give tiers = FILE too")
        return plan_model
    # Imported only with --tiers: planweave.allocate (and the models package it imports) cost a run without
    # tiers ~20 ms of start-up (docs/benchmarks.md, start-up).
    from planweave.allocate import AllocationError, AllocationSeam, load_tiers
    from planweave.allocate.cascade_seam import CascadeSeam

    if plan_model is None:
        raise UsageError(f"{config.where('tiers')} applies to the model a plan file's llm steps call: give --model "
                         "NAME too")
    try:
        table = load_tiers(path)
    except AllocationError as exc:
        raise UsageError(f"{config.where('tiers')}: {exc}") from None
    seam = AllocationSeam(table)
    return replace(plan_model, allocation=seam, cascade=CascadeSeam(table, auto=cascade, hurried=seam.hurried))


def _goal_tiers(config: LoadedConfig, auto: bool = False) -> TierTable | None:
    """The tiers a goal run's planner cascades over (config: tiers = FILE, cascade = true) or is allocated over
    (``auto``: --model auto and tiers = FILE); None without tiers; exit 2 naming the key for a bad file, or tiers
    without either."""
    path = None if config.values.tiers is None else Path(config.values.tiers)
    cascade = bool(config.values.cascade)
    if auto and (path is None or cascade):
        raise UsageError("--model auto has the allocator choose the planner's tier before each call: give "
                         "tiers = FILE in the --config, without cascade (which cascades the planner instead)")
    if path is None:
        if cascade:
            raise UsageError(f"{config.where('cascade')} needs the tiers to cascade over: give tiers = FILE too")
        return None
    if not (cascade or auto):
        raise UsageError(f"{config.where('tiers')}: a goal run's planner uses tiers with cascade = true (it "
                         "cascades over them) or with --model auto (its tier is chosen before each call)")
    from planweave.allocate import AllocationError, load_tiers

    try:
        return load_tiers(path)
    except AllocationError as exc:
        raise UsageError(f"{config.where('tiers')}: {exc}") from None


def _bind_allocation(plan_model: PlanModel | None, engine: Engine, deadline: float | None) -> None:
    """Let a --tiers allocator read the engine's runs, and count the run's --deadline from now."""
    if plan_model is None or plan_model.allocation is None:
        return
    plan_model.allocation.bind(engine.get)
    plan_model.allocation.history = _history(engine)
    if plan_model.cascade is not None:
        plan_model.cascade.bind(engine)
    if deadline is not None:
        plan_model.allocation.deadline_at = engine.clock.now() + deadline


def _history(engine: Engine) -> Callable[[], Awaitable[Estimates]]:
    """The estimates of the journal's past runs, read when an allocator first decides (its tiers' prior)."""
    async def read() -> Estimates:
        from planweave.forecast.history import read_estimates

        return await read_estimates(engine.journal)

    return read


def _pressure_key(config: LoadedConfig, deadline: float | None) -> float | None:
    """The config's ``deadline_pressure`` checked: a probability in (0, 1], with a --deadline to be late for (exit
    2 naming the key)."""
    value = config.values.deadline_pressure
    if value is None:
        return None
    from planweave.allocate.pressure import PressureError, policy_for

    try:
        policy_for(None, value, where=config.where("deadline_pressure"))
    except PressureError as exc:
        raise UsageError(str(exc)) from None
    if deadline is None:
        raise UsageError(f"{config.where('deadline_pressure')} acts when the forecast of the time left falls below "
                         "it: give --deadline S too")
    return value


def _watch_pressure(run: Run, threshold: float | None, *, seam: AllocationSeam | None = None,
                    planner: PlanningLoop | None = None) -> None:
    """Deadline pressure on ``run`` (its plan's ``pressure:``, ``threshold`` in place of its ``p_deadline``), if
    either asks for it; the run's live forecast must be started in the same loop turn (it fires on its events)."""
    from planweave.allocate.pressure import policy_for
    from planweave.allocate.pressure_watch import PressureWatch

    policy = policy_for(run.plan.spec.pressure, threshold)
    if policy is not None:
        PressureWatch(run, policy, seam=seam, planner=planner)


def _journaled_planner_tiers(run_id: str, recorded: JournaledLimits) -> TierTable | None:
    """The tiers a resumed --goal run's planner cascades over: the ones it journaled with --cascade (else none)."""
    if not recorded.cascade or recorded.tiers is None:
        return None
    from planweave.allocate import AllocationError, TierTable

    try:
        return TierTable.from_mapping(recorded.tiers, where=f"run '{run_id}': its journaled tiers")
    except AllocationError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class ResumeLimits:
    """The limits given to ``planweave resume`` without ``--model`` (None: keep the run's journaled ones)."""

    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None
    deadline: float | None  # a new deadline, counted from the resume
    tiers: Path | None = None  # a tier table replacing the journaled one
    speculate: SpeculationMode | None = None  # --speculate: the journaled speculation's mode replaced
    predictor_model: str | None = None  # --predictor-model
    access: Endpoint | None = None  # the config's api_key_env and headers
    config: LoadedConfig | None = None  # where the keys above were written (messages)

    async def resume(self, engine: Engine, stack: AsyncExitStack, toolbox: Toolbox, run_id: str,
                     retry_unknown: bool) -> Run:
        """Resume ``run_id`` within the limits it was started with (the ones given here replace them): its ``llm``
        steps on the model it journaled, within what is left of its budget, and its deadline at the time it was
        set for; raises UsageError naming a flag that does not apply to the run."""
        events = await engine.journal.read(run_id)
        recorded = JournaledLimits.from_events(events).with_overrides(
            RunLimits(self.budget_usd, self.budget_tokens, self.deadline), engine.clock.now())
        budget = recorded.budget()  # the llm steps and the predictor spend from one budget
        tools = None
        seam: AllocationSeam | None = None
        if recorded.model is None:
            self._check_without_model(run_id)
        else:
            base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
            seam = self._allocation(engine, run_id, recorded)
            steps = None
            if seam is not None:  # its cascades go on at their journaled tiers (--cascade: model: auto too)
                from planweave.allocate.cascade_seam import CascadeSeam

                steps = CascadeSeam(seam.table, auto=recorded.cascade, hurried=seam.hurried)
                steps.bind(engine)
            # The endpoint it was run with (base URL, key variable), the parts given here replacing it.
            endpoint = _endpoint(self.base_url, self.access).over(recorded_endpoint(recorded))
            tools = await PlanModel(recorded.model, endpoint.base_url, None, None, seam, steps, endpoint).toolbox(
                stack, base, budget, engine.redact)
        policy = resumed_speculation(events, self.speculate, self.predictor_model)
        predictor = None if policy is None else await open_predictor(
            stack, policy, self.base_url if self.access is None else _endpoint(self.base_url, self.access), budget)
        run = await engine.resume(run_id, tools=tools, retry_unknown=retry_unknown, speculation=policy,
                                  predictor=predictor)
        recorded.apply_deadline(engine, run)
        created = run.state.created_at
        if created is not None and (recorded.deadline_at is not None or recorded.limits.budget_usd is not None):
            from planweave.forecast.live import LiveOptions, start_live_forecast

            deadline = None if recorded.deadline_at is None else recorded.deadline_at - created  # from its start
            start_live_forecast(engine, run, LiveOptions(deadline, recorded.limits.budget_usd,
                                                         concurrency=engine.concurrency,
                                                         capacities=dict(engine.capacities)))
            if recorded.deadline_at is not None:
                _watch_pressure(run, recorded.pressure, seam=seam)
        return run

    def _allocation(self, engine: Engine, run_id: str, recorded: JournaledLimits) -> AllocationSeam | None:
        """The allocator of the resumed run's ``model: auto`` steps: on --tiers if given, else on the tier table
        it journaled (None: it had none), to finish by its deadline."""
        from planweave.allocate import AllocationError, AllocationSeam, TierTable, load_tiers

        try:
            if self.tiers is not None:
                table = load_tiers(self.tiers)
            elif recorded.tiers is not None:
                table = TierTable.from_mapping(recorded.tiers, where=f"run '{run_id}': its journaled tiers")
            else:
                return None
        except AllocationError as exc:
            where = self.config.where("tiers") if self.config is not None else "tiers"
            raise UsageError(f"{where}: {exc}" if self.tiers is not None else str(exc)) from None
        seam = AllocationSeam(table, deadline_at=recorded.deadline_at, history=_history(engine))
        seam.bind(engine.get)
        return seam

    def _check_without_model(self, run_id: str) -> None:
        where = self.config.where("tiers") if self.config is not None else "tiers"
        for flag, given in (("--base-url", self.base_url), ("--budget-usd", self.budget_usd),
                            ("--budget-tokens", self.budget_tokens), (where, self.tiers)):
            if given is not None:
                raise UsageError(f"{flag} applies to the model a run calls, and run '{run_id}' was started without "
                                 "one: give --model NAME too (a --goal run), or leave it out")


# The model and limit options ``run`` and ``resume`` share.
BaseUrlOption = Annotated[str | None, typer.Option("--base-url", rich_help_panel=PANEL_MODEL, metavar="URL",
                                                   help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")]
BudgetUsdOption = Annotated[float | None, typer.Option("--budget-usd", rich_help_panel=PANEL_MODEL, min=0,
                                                       help="Hard budget in USD.")]
BudgetTokensOption = Annotated[int | None, typer.Option("--budget-tokens", rich_help_panel=PANEL_MODEL, min=0,
                                                        help="Hard budget in tokens.")]
DeadlineOption = Annotated[float | None, typer.Option("--deadline", rich_help_panel=PANEL_MODEL, min=0,
                                                      help="Stop after this many seconds.")]
MaxReplansOption = Annotated[int | None, typer.Option("--max-replans", rich_help_panel=PANEL_MODEL, min=0,
                                                      help="Most re-plans of a goal run (default 5).")]
AskHumanOption = Annotated[
    bool,
    typer.Option("--ask-human", rich_help_panel=PANEL_MODEL,
                 help="When retries, fallbacks and re-plans cannot repair a failed step of a goal run, ask "
                      "a person (a human.input step: retry, skip with a value, or abort) instead of failing."),
]


def _memory_flags(memory: bool, config: LoadedConfig, url: str) -> None:
    """``--memory`` and the config's ``memory_model`` checked: on a durable journal (exit 2 otherwise)."""
    if config.values.memory_model is not None and not memory:
        raise UsageError(f"{config.where('memory_model')} applies with --memory: it names the model that distils "
                         "the run")
    if memory and url.startswith(("memory://", "null://")):
        raise UsageError(f"--memory keeps lessons and skills in the journal's database: {url} keeps nothing "
                         "after the run (use sqlite:///path.db or postgresql://...)")


def _memory_embed_flag(memory: bool, memory_embed: bool, where: str = "memory_embed") -> None:
    """``memory_embed`` (``where``: the key and its file): with --memory, and the embedding model there (exit 2
    naming what to install)."""
    if memory_embed and not memory:
        raise UsageError(f"{where} applies with --memory: it ranks the recalled entries by embeddings too")
    if memory_embed:
        from planweave.memory.embed import require_embeddings

        require_embeddings()


async def _open_recall(stack: AsyncExitStack, url: str, memory: bool,
                       embed: bool = False) -> Callable[[str], Awaitable[str]] | None:
    """With ``--memory``, the planner's memory: verified entries of the journal's memory store recalled for the
    goal (None without); ``--memory-embed`` ranks them by BM25 and embedding cosine (planweave.memory.hybrid)."""
    if not memory:
        return None
    from planweave.memory import MemoryRecall, open_memory_store

    return MemoryRecall(await stack.enter_async_context(open_memory_store(url)), embed=embed)


def _learn_after(memory: bool, outcome: Outcome, url: str, goal: str | None, model: str, base_url: str | None,
                 access: Endpoint | None, tools: Toolbox, virtual: bool) -> None:
    """After a --memory run ended: distil it into candidates and verify them; what happened goes to stderr (the
    run's own exit status and --json object stay as they are; a failure here is a warning)."""
    if not (memory and goal is not None and outcome.run_id is not None and outcome.state is not None
            and outcome.status != "interrupted"):
        return
    from planweave.core.errors import PlanweaveError
    from planweave.memory.session import learn

    outputs = outcome.report.get("outputs") or {}
    try:
        learned = run_loop(learn(url, model, _endpoint(base_url, access), goal, outcome.run_id, outcome.status,
                                 outcome.error, outcome.state, outputs, tools), virtual)
    except PlanweaveError as exc:
        typer.echo(f"memory: nothing learned from run {outcome.run_id}: {exc}", err=True)
        return
    for entry in learned.entries:
        typer.echo(f"memory {entry.id}: {entry.kind} '{entry.name}' v{entry.version} {entry.status}"
                   + (f" ({entry.note})" if entry.note else " (a lesson without a check: planweave memory admit "
                      f"{entry.id})"), err=True)
    for problem in learned.problems:
        typer.echo(f"memory: a distilled line was refused: {problem}", err=True)
    if not learned.entries:
        typer.echo(f"memory: nothing learned from run {outcome.run_id}", err=True)


def _step_timeout_flag(value: float | None) -> float | None:
    """``--step-timeout`` checked: finite seconds above 0 (UsageError otherwise)."""
    try:
        return None if value is None else check_seconds(value, "--step-timeout")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


RunIdOption = Annotated[str | None, typer.Option("--run-id", rich_help_panel=PANEL_OUTPUT, metavar="ID",
                                                 help="Id for the new run (default: random).")]
WatchOption = Annotated[bool, typer.Option("--watch", rich_help_panel=PANEL_OUTPUT,
                                           help="Also serve the dashboard for this run (its port: the config's "
                                                "port, default 8765).")]
AllRowsOption = Annotated[bool, typer.Option("--all", rich_help_panel=PANEL_OUTPUT,
                                             help="End with a row for every step (default: counts, the failed and "
                                                  "the slowest steps).")]
ConcurrencyOption = Annotated[int | None, typer.Option(
    "--concurrency", rich_help_panel=PANEL_SCHEDULING, min=1, metavar="N",
    help="Most steps running at once (default: the plan's, else 32).")]


@dataclass(frozen=True)
class _Started:
    """What ``run`` and ``goal`` set up alike before their runs start."""

    config: LoadedConfig
    toolbox: Toolbox
    session: Session
    access: Endpoint | None
    pressure: float | None


def _start(command: str, config: list[str] | None, journal: str | None, json_output: bool, tools: list[str] | None,
           mcp: list[str] | None, virtual_clock: bool, workdir: Path, allow_exec: list[str] | None, watch: bool,
           all_rows: bool, model: str | None, base_url: str | None, deadline: float | None,
           *resume_more: str) -> _Started:
    """The run configuration read (exit 2 naming a bad key and its file), its files used, the tools loaded and the
    session to run in."""
    loaded = load_config(config, command)
    values = loaded.values
    check_model_name(model)
    access = config_access(loaded)
    use_config_files(loaded)
    toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                  tuple(Path(r) for r in values.roots or ()),
                                                  tuple(values.allow_env or ())))
    session = Session(journal or default_journal_url(), toolbox, tuple(tools or ()), virtual_clock, json_output,
                      tuple(mcp or ()), (8765 if values.port is None else values.port) if watch else None,
                      all_rows=all_rows,
                      executor=ExecutorFlags(values.executor, values.ray_address, tuple(tools or ())),
                      cache=values.cache is not False,
                      resume_flags=_resume_flags(workdir, allow_exec,
                                                 None if journaled_endpoint(base_url) else base_url,
                                                 *loaded.resume_args(), *resume_more))
    return _Started(loaded, toolbox, session, access, _pressure_key(loaded, deadline))


def run(
    file: Annotated[Path, typer.Argument(help="The plan file (YAML or JSON).", show_default=False)],
    config: ConfigOption = None,
    journal: JournalOption = None,
    run_id: RunIdOption = None,
    json_output: JsonOption = False,
    virtual_clock: VirtualOption = False,
    watch: WatchOption = False,
    all_rows: AllRowsOption = False,
    concurrency: ConcurrencyOption = None,
    capacity: Annotated[
        list[str] | None,
        typer.Option("--capacity", rich_help_panel=PANEL_SCHEDULING,
                     metavar="NAME=N", help="Capacity of a resource; overrides the plan's (repeatable)."),
    ] = None,
    step_timeout: Annotated[float | None, typer.Option(
        "--step-timeout", rich_help_panel=PANEL_SCHEDULING, metavar="S",
        help="Seconds per attempt for steps without their own timeout; overrides the plan's defaults.timeout "
             "(default: the plan's, else 600; a step's own timeout: null means no limit; steps waiting on people "
             "are exempt).")] = None,
    on_failure: Annotated[Literal["stop", "continue"] | None, typer.Option(
        "--on-failure", rich_help_panel=PANEL_SCHEDULING,
        help="A step failing for good: stop the run (cancel what runs, start nothing new) or continue the other "
             "branches (default: the plan's on_failure, else stop).",
    )] = None,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", rich_help_panel=PANEL_MODEL, metavar="NAME", envvar="PLANWEAVE_MODEL",
        help="The model the plan's llm steps call ('local': the bundled local model).")] = None,
    base_url: BaseUrlOption = None,
    budget_usd: BudgetUsdOption = None,
    budget_tokens: BudgetTokensOption = None,
    deadline: DeadlineOption = None,
) -> None:
    """Run a plan file, showing its steps live; exit 0 only if the run succeeded.

    The rarer knobs (tiers, speculation, the executor, prices, the endpoint's key and headers...) are keys of a
    --config file: docs/cli.md lists them.
    """
    with clean_errors(json_output):
        started = _start("run", config, journal, json_output, tools, mcp, virtual_clock, workdir, allow_exec, watch,
                         all_rows, model, base_url, deadline)
        loaded, toolbox, session, access, pressure = (started.config, started.toolbox, started.session,
                                                      started.access, started.pressure)
        values = loaded.values
        speculate, predictor_model, cascade = values.speculate, values.predictor_model, bool(values.cascade)
        priority = values.priority or 0.0
        forecast = bool(values.forecast)
        flags = {**(values.capacities or {}), **parse_capacities(capacity or ())}
        plan_model = PlanModel.from_flags(model or None, base_url, budget_usd, budget_tokens, access, loaded)
        plan_model = _with_tiers(plan_model, loaded)
        spec = load_plan_file(file)
        spec = with_default_timeout(spec, _step_timeout_flag(step_timeout))
        require_priced(_plan_models(plan_model, predictor_model, spec), budget_usd)  # exit 2 before any call
        session = replace(session, executor=session.executor.for_plan(spec))
        capacities = {**spec.capacities, **flags}
        speculation = with_predictor(spec, speculate, predictor_model)
        checked: Plan | None = None
        if not mcp and plan_model is None:  # MCP tools and llm are known only once connected: then the
            # engine validates at start.
            # Check everything before the journal is opened: an invalid plan leaves no trace there. The engine
            # takes the checked plan as it is (Plan.checked_against): a plan file is validated once.
            checked = validate_plan(spec, toolbox, capacities, source=str(file))
        limits = Limits(concurrency or spec.concurrency or DEFAULT_CONCURRENCY, capacities)

        async def begin_file(engine: Engine, stack: AsyncExitStack) -> Run:
            base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
            run_limits = RunLimits(budget_usd=budget_usd, budget_tokens=budget_tokens, deadline=deadline)
            _bind_allocation(plan_model, engine, deadline)
            budget = run_limits.budget()  # the llm steps and the predictor spend from one budget
            tools = await _plan_tools(plan_model, stack, base, budget, engine.redact)
            seam = plan_model.allocation if plan_model is not None else None
            predictor = await open_predictor(stack, resolve_policy(spec, speculation),
                                             base_url if access is None else _endpoint(base_url, access), budget)
            started = await engine.start(spec if checked is None else checked, tools=tools, run_id=run_id,
                                         source=str(file), on_failure=on_failure, priority=priority,
                                         speculation=speculation, predictor=predictor,
                                         limits=run_limits.journaled(
                                             engine.clock.now(), plan_model.model if plan_model else None,
                                             tiers=None if seam is None else seam.table.to_mapping(),
                                             pressure=pressure, cascade=True if cascade else None,
                                             **(plan_model.endpoint.journaled() if plan_model else {})))
            if deadline is not None:
                from planweave.engine.runtime import cancel_at_deadline

                cancel_at_deadline(engine, started, deadline)
            if forecast or deadline is not None or budget_usd is not None:
                from planweave.forecast.live import LiveOptions, start_live_forecast

                start_live_forecast(engine, started, LiveOptions(
                    deadline, budget_usd, concurrency=limits.concurrency, capacities=capacities))
                if deadline is not None:
                    _watch_pressure(started, pressure, seam=seam)
            return started

        async def fixed_limits(_journal: Journal) -> Limits:
            return limits

        with tool_output_to_stderr(json_output):
            outcome = run_loop(follow_run(session, fixed_limits, begin_file, console_for(json_output)),
                               virtual_clock)
    report_outcome(outcome, session)
    raise typer.Exit(outcome.exit_code)


def goal(
    text: Annotated[str, typer.Argument(
        metavar="GOAL", show_default=False,
        help="What to achieve: a model plans it as a DAG of steps, runs it and re-plans around failures.")],
    config: ConfigOption = None,
    journal: JournalOption = None,
    run_id: RunIdOption = None,
    json_output: JsonOption = False,
    virtual_clock: VirtualOption = False,
    watch: WatchOption = False,
    all_rows: AllRowsOption = False,
    concurrency: ConcurrencyOption = None,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", rich_help_panel=PANEL_MODEL, metavar="NAME", envvar="PLANWEAVE_MODEL",
        help=f"The model the planner and the llm tool call (default {DEFAULT_GOAL_MODEL}; 'local': the bundled "
             "local model; 'auto': the cheapest fitting tier of the config's tiers, chosen before each call).")
    ] = None,
    base_url: BaseUrlOption = None,
    budget_usd: BudgetUsdOption = None,
    budget_tokens: BudgetTokensOption = None,
    deadline: DeadlineOption = None,
    max_replans: MaxReplansOption = None,
    ask_human: AskHumanOption = False,
    memory: Annotated[bool, typer.Option("--memory", rich_help_panel=PANEL_MODEL, help=(
        "Put the verified lessons and skills relevant to the goal into the planner's prompt; after the run, "
        "distil new ones (one model call) and verify them (a skill replayed, a lesson's check run) before they are "
        "admitted. Kept in the journal's database (planweave memory list; docs/memory.md)."))
    ] = False,
) -> None:
    """Plan a goal with a model and run it, showing its steps live; exit 0 only if the run succeeded.

    The rarer knobs (tiers, a draft model, the planner's context, memory's model, the endpoint's key and
    headers...) are keys of a --config file: docs/cli.md lists them.
    """
    with clean_errors(json_output):
        started = _start("goal", config, journal, json_output, tools, mcp, virtual_clock, workdir, allow_exec,
                         watch, all_rows, model, base_url, deadline, *(["--ask-human"] if ask_human else []))
        loaded, toolbox, session, access, pressure = (started.config, started.toolbox, started.session,
                                                      started.access, started.pressure)
        values = loaded.values
        memory_model, memory_embed = values.memory_model, bool(values.memory_embed)
        _memory_flags(memory, loaded, session.journal_url)
        _memory_embed_flag(memory, memory_embed, loaded.where("memory_embed"))
        priority = values.priority or 0.0
        goal_tiers = _goal_tiers(loaded, auto=model == "auto")
        # A dollar budget bounds only models with a price (the planner's, its tiers', the draft model): exit 2
        # before any call, never counting their calls as free.
        require_priced(called_models(model or DEFAULT_GOAL_MODEL, goal_tiers, values.draft_model), budget_usd)
        limits = Limits(concurrency or DEFAULT_CONCURRENCY, dict(values.capacities or {}))
        agent = AgentFlags(model or DEFAULT_GOAL_MODEL, base_url, budget_usd, budget_tokens, deadline,
                           5 if max_replans is None else max_replans, values.plan_max_tokens or 2048, ask_human,
                           tiers=goal_tiers, draft_model=values.draft_model, planner_auto=model == "auto",
                           context=values.context, subplans=values.subplans is not False, access=access,
                           plan_via=values.plan_via)

        async def begin_goal(engine: Engine, stack: AsyncExitStack) -> Run:
            from planweave.planning.goal import launch_goal

            # pressure journaled: a resume watches it again
            loop = await agent.planning_loop(engine, stack, toolbox, pressure=pressure, recall=await _open_recall(
                stack, session.journal_url, memory, memory_embed))
            # the run, and with deadline_pressure the forecast it acts on (a goal run has none otherwise)
            return await launch_goal(loop, text, run_id=run_id, priority=priority, forecast=False)

        async def fixed_limits(_journal: Journal) -> Limits:
            return limits

        with tool_output_to_stderr(json_output):
            outcome = run_loop(follow_run(session, fixed_limits, begin_goal, console_for(json_output)),
                               virtual_clock)
    report_outcome(outcome, session)
    _learn_after(memory, outcome, session.journal_url, text, memory_model or model or DEFAULT_GOAL_MODEL,
                 base_url, access, toolbox, virtual_clock)
    raise typer.Exit(outcome.exit_code)


def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.", show_default=False)],
    config: ConfigOption = None,
    journal: JournalOption = None,
    retry_unknown: Annotated[
        bool,
        typer.Option("--retry-unknown", rich_help_panel=PANEL_SCHEDULING,
                     help="Run again the non-idempotent steps that were running when the run was interrupted."),
    ] = False,
    done: Annotated[
        list[str] | None,
        typer.Option("--done", rich_help_panel=PANEL_SCHEDULING, metavar="STEP[=OUTPUT]",
                     help="First record that STEP (not idempotent, running when the run was interrupted) had its "
                          "effect, with OUTPUT (JSON, default null) as its output: it succeeds without running again. "
                          "Repeatable."),
    ] = None,
    json_output: JsonOption = False,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    virtual_clock: VirtualOption = False,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", rich_help_panel=PANEL_MODEL, metavar="NAME",
        help="For a goal run: the model its planner and llm tool call (default: the one it was started with, "
             "from the journal).")] = None,
    base_url: BaseUrlOption = None,
    budget_usd: BudgetUsdOption = None,
    budget_tokens: BudgetTokensOption = None,
    deadline: DeadlineOption = None,
    max_replans: MaxReplansOption = None,
    ask_human: AskHumanOption = False,
    all_rows: AllRowsOption = False,
) -> None:
    """Continue an interrupted or failed run: finished steps are kept, the rest runs with the run's own limits.

    The run keeps the values journaled when it started: its concurrency, capacities and step timeouts (the plan's
    defaults.timeout, or the --step-timeout or built-in default it was run with) are not changed by a resume. Of a
    --config, a resume reads the keys it takes (the endpoint's key and headers, tiers, executor, cache, the jail,
    speculation) and leaves the others to the journal.
    """
    with clean_errors(json_output):
        loaded = load_config(config, "resume")
        values = loaded.values
        use_config_files(loaded)
        url = journal or default_journal_url()
        if journal_file_missing(url):
            raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")
        import json

        settled: list[tuple[str, object]] = []  # --done: (step, output)
        for flag in done or ():
            step, given_output, raw = flag.partition("=")
            try:
                settled.append((step, json.loads(raw) if given_output else None))
            except json.JSONDecodeError as exc:
                raise UsageError(f"--done {flag}: OUTPUT is not JSON ({exc})") from None
        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(Path(r) for r in values.roots or ()),
                                                      tuple(values.allow_env or ())))
        session = Session(url, toolbox, tuple(tools or ()), virtual_clock, json_output, tuple(mcp or ()),
                          all_rows=all_rows,
                          executor=ExecutorFlags(values.executor, values.ray_address, tuple(tools or ())),
                          cache=values.cache is not False,
                          resume_flags=_resume_flags(workdir, allow_exec, base_url, *loaded.resume_args(),
                                                     *(["--model", model] if model is not None else []),
                                                     *(["--ask-human"] if ask_human else [])))
        tiers = None if values.tiers is None else Path(values.tiers)
        speculate, predictor_model = values.speculate, values.predictor_model

        async def recorded_limits(opened: Journal) -> Limits:
            # The engine must admit steps as the original run did: its limits are in run_created.
            events = await opened.read(run_id)
            if not events:
                raise RunNotFound(f"no run '{run_id}' in the journal {url}")
            if url.startswith(("postgresql://", "postgres://")):
                from planweave.workers import refuse_if_queued  # a worker's run is resumed by the workers

                await refuse_if_queued(url, run_id)
            options = events[0].data.get("options") or {}
            return Limits(options.get("concurrency"), dict(options.get("capacities") or {}))

        access = config_access(loaded)
        given = ResumeLimits(base_url, budget_usd, budget_tokens, deadline, tiers, speculate, predictor_model,
                             access, loaded)

        async def begin(engine: Engine, stack: AsyncExitStack) -> Run:
            if settled:  # a person's word, journaled before the resume reads the run
                from planweave.cli.reply_cmd import author
                from planweave.engine.runtime import mark_done

                for step, output in settled:
                    await mark_done(engine.journal, run_id, step, output, by=author(), redact=engine.redact)
            events = await engine.journal.read(run_id)
            # A --goal run's planner and joiner need their model: the one given, else the one it was started with.
            planner_model = model if model is not None else _goal_model(run_id, events)
            _resume_mode_flags(run_id, planner_model, ask_human, max_replans, loaded)
            if planner_model is not None:
                # The limits it was started with (those given here replace them): what is left of its budget,
                # the time left until its deadline.
                recorded = JournaledLimits.from_events(events).with_overrides(
                    RunLimits(budget_usd, budget_tokens, deadline, max_replans), engine.clock.now())
                kept = recorded.limits
                modes = _journaled_modes(run_id, recorded)  # planned as it started, not with a later default
                # Its endpoint too, unless given, with the model it was started with (another model: its own).
                endpoint = _endpoint(base_url, access).over(
                    recorded_endpoint(recorded) if model is None else _endpoint(None, None))
                agent = AgentFlags(planner_model, endpoint.base_url, kept.budget_usd, kept.budget_tokens,
                                   recorded.remaining_s(engine.clock.now()),
                                   5 if kept.max_replans is None else kept.max_replans, 2048, ask_human,
                                   tiers=_journaled_planner_tiers(run_id, recorded),
                                   planner_auto=recorded.planner == "auto", context=modes[0], subplans=modes[1],
                                   access=endpoint)
                loop = await agent.planning_loop(engine, stack, toolbox, recorded.budget())
                try:
                    resumed = await loop.resume(run_id, retry_unknown=retry_unknown)
                except PlanInvalid as exc:
                    raise _without_tools(run_id, exc) from None
                created = resumed.state.created_at
                if recorded.pressure is not None and recorded.deadline_at is not None and created is not None:
                    from planweave.forecast.live import LiveOptions, start_live_forecast

                    start_live_forecast(engine, resumed, LiveOptions(recorded.deadline_at - created,
                                                                     kept.budget_usd,
                                                                     concurrency=engine.concurrency))
                    _watch_pressure(resumed, recorded.pressure, planner=loop)
                return resumed
            try:
                return await given.resume(engine, stack, toolbox, run_id, retry_unknown)
            except PlanInvalid as exc:
                if any("unknown tool 'llm'" in str(p) for p in exc.problems):
                    raise UsageError(f"{exc}\n(run '{run_id}' calls a model: resume it with --model NAME to "
                                     "re-attach its model, planner and llm tool)") from None
                raise _without_tools(run_id, exc) from None

        with tool_output_to_stderr(json_output):
            outcome = run_loop(follow_run(session, recorded_limits, begin, console_for(json_output), "resumed"),
                                virtual_clock)
    report_outcome(outcome, session)
    raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    """Add ``run``, ``goal`` and ``resume`` to ``app``."""
    for command in (run, goal, resume):
        app.command()(command)
