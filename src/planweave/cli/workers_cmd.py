"""``planweave submit``, ``worker`` and ``workers``: runs queued in a PostgreSQL journal and the workers running them.

``submit`` checks a plan file against the tools (the same flags as ``run``) and queues it; ``worker`` claims queued
runs under leases and runs them until SIGTERM/SIGINT (then hands them back); ``workers`` lists the workers, the runs
they hold and their leases' ages.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from planweave.cli.common import (
    AllowExecOption,
    Confinement,
    JournalOption,
    JsonOption,
    McpOption,
    NoCacheOption,
    PriorityOption,
    ToolsOption,
    UsageError,
    WorkdirOption,
    clean_errors,
    load_tools,
    open_mcp,
    print_json,
)
from planweave.cli.executor_flags import ExecutorFlags, ExecutorOption, RayAddressOption
from planweave.cli.price_flags import queued_models, require_priced
from planweave.cli.run_config import ConfigOption, config_access, load_config, use_config_files
from planweave.extras import require
from planweave.journal import default_journal_url, redact_url

if TYPE_CHECKING:
    from planweave.allocate import AllocationSeam
    from planweave.engine.executor import Executor
    from planweave.journal.leases import LeaseStore, WorkerView
    from planweave.journal.postgres import PostgresJournal
    from planweave.models import Budget, Endpoint, ModelClient
    from planweave.tools import Toolbox
    from planweave.workers import WorkerOptions

__all__ = ["register", "submit", "worker", "workers"]


def _queue_url(url: str | None, command: str) -> str:
    url = url or default_journal_url()
    if not url.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"planweave {command} needs a postgresql:// journal that the workers share (--journal or "
                         f"$PLANWEAVE_JOURNAL), got {redact_url(url)}")
    require("postgres", f"planweave {command}")
    return url


@asynccontextmanager
async def _queue(url: str) -> AsyncIterator[tuple[PostgresJournal, LeaseStore]]:
    from planweave.journal.leases import LeaseStore
    from planweave.journal.postgres import PostgresJournal

    journal = await PostgresJournal.open(url)
    try:
        store = await LeaseStore.open(url)
        try:
            yield journal, store
        finally:
            await store.close()
    finally:
        await journal.close()


def _toolbox(tools: list[str] | None, workdir: Path, allow_exec: list[str] | None, allow_env: list[str] | None,
             root: list[Path] | None) -> Toolbox:
    return load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                               tuple(root or ()), tuple(allow_env or ())))


def submit(
    file: Annotated[Path, typer.Argument(help="The plan file (YAML or JSON).", show_default=False)],
    journal: JournalOption = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id for the new run (default: random).")] = None,
    step_timeout: Annotated[float | None, typer.Option(
        "--step-timeout", metavar="S", help="Seconds per attempt for steps without their own timeout (as for "
                                            "run).")] = None,
    on_failure: Annotated[Literal["stop", "continue"] | None, typer.Option(
        "--on-failure", help="A step failing for good: stop the run or continue the other branches (default: the "
                             "plan's on_failure, else stop).")] = None,
    retry_unknown: Annotated[bool, typer.Option(
        "--retry-unknown", help="When a worker takes the run over, re-run the steps that were running even if they "
                                "are not idempotent (default: they become unknown and the run stops short).")] = False,
    priority: PriorityOption = 0.0,
    model: Annotated[str | None, typer.Option(
        "--model", help="The model the plan's llm steps call (the worker's --base-url endpoint serves it).",
        envvar="PLANWEAVE_MODEL")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=0, help="Hard budget in USD for the "
                                                                                 "llm steps.")] = None,
    budget_tokens: Annotated[int | None, typer.Option("--budget-tokens", min=0, help="Hard budget in tokens for "
                                                                                     "the llm steps.")] = None,
    deadline: Annotated[float | None, typer.Option(
        "--deadline", min=0, help="Cancel the run this many seconds after a worker starts it (kept by a worker "
                                  "that takes it over).")] = None,
    tiers: Annotated[Path | None, typer.Option("--tiers", metavar="FILE", help=(
        "Model tiers (YAML/JSON) for the plan's llm steps saying model: auto: the worker allocates tier and "
        "samples per step (docs/allocation.md); kept by a worker that takes the run over."))] = None,
    config: ConfigOption = None,
    json_output: JsonOption = False,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
) -> None:
    """Queue a plan file for the workers of a PostgreSQL journal and print its run id at once.

    Prices and the jail's env keys and roots are keys of a --config file (docs/cli.md).
    """
    with clean_errors(json_output):
        from planweave.core.plan.defaults import with_default_timeout
        from planweave.core.plan.graph import validate_plan
        from planweave.journal.leases import QueuedRun
        from planweave.planfile import load_plan_file
        from planweave.tools.safety import SecretRedactor

        loaded = load_config(config, "submit")
        url = _queue_url(journal, "submit")
        if model is None:
            for flag, given in (("--budget-usd", budget_usd), ("--budget-tokens", budget_tokens),
                                ("--tiers", tiers)):
                if given is not None:
                    raise UsageError(f"{flag} applies to the model the plan's llm steps call: give --model NAME too")
        limits = _queued_limits(budget_usd, budget_tokens, _seconds_flag(deadline, "--deadline"))
        table = _tiers_flag(tiers)
        toolbox = _toolbox(tools, workdir, allow_exec, loaded.values.allow_env,
                           [Path(r) for r in loaded.values.roots or ()])
        if model is not None and "llm" not in toolbox:
            toolbox = toolbox.merged(_llm_for_checks())
        spec = with_default_timeout(load_plan_file(file), _seconds_flag(step_timeout))
        use_config_files(loaded)  # prices: a dollar budget over a model without a price exits 2, nothing queued
        require_priced(queued_models(spec, model, table), budget_usd)
        rid = run_id or uuid.uuid4().hex[:12]

        async def go() -> None:
            async with AsyncExitStack() as stack:
                box = await open_mcp(stack, tuple(mcp or ()), toolbox)
                # Checked here, against the same tools the workers are given: a bad plan never reaches the queue.
                plan = validate_plan(spec, box, spec.capacities, source=str(file))
                async with _queue(url) as (_, store):
                    options: dict[str, Any] = {"retry_unknown": retry_unknown}
                    if on_failure is not None:
                        options["on_failure"] = on_failure
                    if priority:
                        options["priority"] = priority
                    if limits:
                        options["limits"] = limits
                    if model is not None:
                        options["model"] = model
                    if table is not None:
                        options["tiers"] = table
                    # Its secrets sealed as `run` seals a journaled plan; the worker running it puts them back.
                    queued = QueuedRun(rid, plan.to_document(), str(file), options)
                    await store.submit(queued.sealed(SecretRedactor()))

        asyncio.run(go())
    if json_output:
        print_json({"status": "queued", "run_id": rid, "journal": redact_url(url)})
    else:
        typer.echo(rid)
        typer.echo(f"queued run {rid}: a worker (planweave worker --journal {redact_url(url)}) runs it", err=True)


def _tiers_flag(path: Path | None) -> dict[str, Any] | None:
    """The tier table in ``path``, checked (exit 2 naming the file, the tier and the field), as a queued run
    carries it (``options.tiers``)."""
    if path is None:
        return None
    from planweave.allocate import AllocationError, load_tiers

    try:
        return load_tiers(path).to_mapping()
    except AllocationError as exc:
        raise UsageError(f"--tiers: {exc}") from None


def _seconds_flag(value: float | None, flag: str = "--step-timeout") -> float | None:
    if value is not None and not 0 < value < float("inf"):
        raise UsageError(f"{flag} {value}: expected a number of seconds above 0")
    return value


def _queued_limits(budget_usd: float | None, budget_tokens: int | None, deadline: float | None) -> dict[str, Any]:
    """The limits a queued run carries (``options.limits``): only those given."""
    given = {"budget_usd": budget_usd, "budget_tokens": budget_tokens, "deadline": deadline}
    return {k: v for k, v in given.items() if v is not None}


def _llm_for_checks() -> Toolbox:
    """An ``llm`` tool for checking a plan at submit (the workers bind the real one): it is never called."""
    from typing import cast

    from planweave.models import ModelClient
    from planweave.tools import Toolbox
    from planweave.tools.llm import llm_tool

    return Toolbox({"llm": llm_tool(cast(ModelClient, None))})


def worker(
    journal: JournalOption = None,
    name: Annotated[str | None, typer.Option("--name", help="This worker's name (default: host-pid).")] = None,
    max_runs: Annotated[int, typer.Option("--max-runs", min=1, help="Most runs this worker holds at once.")] = 16,
    lease: Annotated[float, typer.Option("--lease", min=0.1, max=3600, metavar="S",
                                         help="Seconds a lease lasts unless renewed: a worker that dies has its runs "
                                              "taken over this long after its last renewal.")] = 10.0,
    renew_every: Annotated[float | None, typer.Option(
        "--renew-every", min=0.01, metavar="S", help="Seconds between renewals (default: a third of --lease).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1,
                                             help="Most steps running at once across this worker's runs.")] = 64,
    json_output: JsonOption = False,
    config: ConfigOption = None,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    executor: ExecutorOption = None,
    ray_address: RayAddressOption = None,
    base_url: Annotated[str | None, typer.Option(
        "--base-url", metavar="URL", help="OpenAI-compatible endpoint of the models queued runs' llm steps call "
                                          "(default $OPENAI_BASE_URL).")] = None,
    no_cache: NoCacheOption = False,
) -> None:
    """Run the runs queued in a PostgreSQL journal, under leases, until SIGTERM/SIGINT (then hand them back).

    The rarer knobs (the endpoint's key variable and headers, model limits, prices, the jail's env keys and roots)
    are keys of a --config file (docs/cli.md).
    """
    with clean_errors(json_output):
        from planweave.workers import WorkerOptions, default_worker_name

        loaded = load_config(config, "worker")
        url = _queue_url(journal, "worker")
        toolbox = _toolbox(tools, workdir, allow_exec, loaded.values.allow_env,
                           [Path(r) for r in loaded.values.roots or ()])
        try:
            options = WorkerOptions(name or default_worker_name(), max_runs, lease, renew_every)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        # The plans are not known yet: with Ray installed, steps that say executor: ray go to Ray (as on resume).
        flags = ExecutorFlags(executor, ray_address, tuple(tools or ()))
        use_config_files(loaded)  # prices: a dollar budget refuses a model without a price
        from planweave.models.endpoint import Endpoint

        access = config_access(loaded)
        endpoint = Endpoint(base_url=base_url) if access is None else replace(access, base_url=base_url)
        tally = asyncio.run(_work(url, options, toolbox, tuple(mcp or ()), concurrency, flags.executor(), endpoint,
                                  cache=not no_cache))
    if json_output:
        print_json({"status": "stopped", "worker": options.name, **tally})
    else:
        typer.echo(f"worker {options.name} stopped: {tally}", err=True)


async def _work(url: str, options: WorkerOptions, toolbox: Toolbox, mcp: tuple[str, ...], concurrency: int,
                executor: Executor, endpoint: Endpoint, *, cache: bool = True) -> dict[str, Any]:
    from planweave.engine.runtime import Engine
    from planweave.tools.safety import SecretRedactor
    from planweave.workers import Worker

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        box = await open_mcp(stack, mcp, toolbox)
        journal, store = await stack.enter_async_context(_queue(url))
        # As `planweave run`'s engine: secrets out of outputs, errors, summaries and (sealed) plans; the worker
        # redacts its queue rows and log lines with it too.
        engine = await stack.enter_async_context(Engine(journal, tools=box, concurrency=concurrency,
                                                            executor=executor, cache=cache, redact=SecretRedactor()))
        runner = Worker(engine, journal, store, options, tools=box, log=log,
                        run_tools=_ModelTools(stack, box, endpoint, engine.redact).tools)
        # Installed until the loop closes (which removes them), not just while serving: a second SIGTERM arriving
        # while the worker closes its engine and journal (a supervisor repeating itself) must not kill it mid-way.
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, runner.stop)
        tally = await runner.serve()
    return tally.as_dict()


class _ModelTools:
    """A queued run's catalog: the worker's tools plus ``llm`` on the model the run names, within its budget (one
    client per model, opened on first use for the worker's life, on the worker's endpoint or its tier's)."""

    def __init__(self, stack: AsyncExitStack, tools: Toolbox, endpoint: Endpoint, redact: object = None) -> None:
        self._stack, self._tools, self._endpoint, self._redact = stack, tools, endpoint, redact
        self._clients: dict[str, ModelClient] = {}

    async def tools(self, model: str | None, budget: Budget | None,
                    allocation: AllocationSeam | None = None) -> Toolbox | None:
        if model is None or "llm" in self._tools:
            return None  # the engine's own tools
        from planweave.models import RoutedClient, resolve_model
        from planweave.tools import Toolbox
        from planweave.tools.llm import llm_tool
        from planweave.tools.safety import hide_secrets

        endpoints = {} if allocation is None else allocation.table.endpoints()
        for name in (model, *endpoints):
            if name not in self._clients:
                given = endpoints[name].over(self._endpoint) if name in endpoints else self._endpoint
                hide_secrets(self._redact, given.secrets())  # its key and headers' values: never shown
                self._clients[name] = await self._stack.enter_async_context(resolve_model(name, endpoint=given))
        client: ModelClient = self._clients[model]
        if endpoints:
            client = RoutedClient(client, {name: self._clients[name] for name in endpoints})
        return self._tools.merged(Toolbox({"llm": llm_tool(client, budget, allocation=allocation)}))


def workers(
    journal: JournalOption = None,
    json_output: JsonOption = False,
    all_workers: Annotated[bool, typer.Option("--all", help="Also list stopped workers.")] = False,
) -> None:
    """List the workers of a PostgreSQL journal, the runs each holds and the ages of their leases."""
    with clean_errors(json_output):
        url = _queue_url(journal, "workers")

        async def go() -> tuple[list[WorkerView], dict[str, int]]:
            async with _queue(url) as (_, store):
                found = await store.workers()
                counts: dict[str, int] = {}
                for lease in await store.leases():
                    key = lease.state if lease.state != "done" else f"done/{lease.outcome}"
                    counts[key] = counts.get(key, 0) + 1
                return found, counts

        found, counts = asyncio.run(go())
    shown = [w for w in found if all_workers or not w.stopped]
    if json_output:
        print_json({"journal": redact_url(url), "runs": counts, "workers": [
            {**asdict(w), "alive": w.alive, "runs": [asdict(r) for r in w.runs]} for w in shown]})
        return
    typer.echo(f"runs: {', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none queued'}")
    if not shown:
        typer.echo("no workers" + ("" if all_workers else " running (--all lists stopped ones)"))
    for w in shown:
        state = "stopped" if w.stopped else ("alive" if w.alive else "not renewing")
        typer.echo(f"{w.name}  {state}  pid {w.pid} on {w.host}  seen {w.seen_s:.1f}s ago  "
                   f"lease {w.lease_s:g}s  {len(w.runs)} run(s)")
        for r in w.runs:
            left = "?" if r.expires_in_s is None else f"{r.expires_in_s:.1f}s"
            held = "?" if r.held_s is None else f"{r.held_s:.1f}s"
            typer.echo(f"  {r.run_id}  epoch {r.epoch}  held {held}  expires in {left}")


def register(app: typer.Typer) -> None:
    """Add ``submit``, ``worker``, ``workers`` to ``app``."""
    for command in (submit, worker, workers):
        app.command()(command)
