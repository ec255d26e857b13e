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
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from planweave.cli.common import (
    AllowEnvOption,
    AllowExecOption,
    Confinement,
    JournalOption,
    JsonOption,
    McpOption,
    PriorityOption,
    RootOption,
    ToolsOption,
    UsageError,
    WorkdirOption,
    clean_errors,
    load_tools,
    open_mcp,
    print_json,
)
from planweave.cli.executor_flags import ExecutorFlags, ExecutorOption, RayAddressOption
from planweave.extras import require
from planweave.journal import default_journal_url

if TYPE_CHECKING:
    from planweave.engine.executor import Executor
    from planweave.journal.leases import LeaseStore, WorkerView
    from planweave.journal.postgres import PostgresJournal
    from planweave.tools import Toolbox
    from planweave.workers import WorkerOptions

__all__ = ["register", "submit", "worker", "workers"]


def _queue_url(url: str | None, command: str) -> str:
    url = url or default_journal_url()
    if not url.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"planweave {command} needs a postgresql:// journal that the workers share (--journal or "
                         f"$PLANWEAVE_JOURNAL), got {url}")
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
    json_output: JsonOption = False,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    allow_env: AllowEnvOption = None,
    root: RootOption = None,
) -> None:
    """Queue a plan file for the workers of a PostgreSQL journal and print its run id at once."""
    with clean_errors(json_output):
        from planweave.journal.leases import QueuedRun
        from planweave.plan.defaults import with_default_timeout
        from planweave.plan.graph import validate_plan
        from planweave.planfile import load_plan_file

        url = _queue_url(journal, "submit")
        toolbox = _toolbox(tools, workdir, allow_exec, allow_env, root)
        spec = with_default_timeout(load_plan_file(file), _seconds_flag(step_timeout))
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
                    await store.submit(QueuedRun(rid, plan.to_document(), str(file), options))

        asyncio.run(go())
    if json_output:
        print_json({"status": "queued", "run_id": rid, "journal": url})
    else:
        typer.echo(rid)
        typer.echo(f"queued run {rid}: a worker (planweave worker --journal {url}) runs it", err=True)


def _seconds_flag(value: float | None) -> float | None:
    if value is not None and not 0 < value < float("inf"):
        raise UsageError(f"--step-timeout {value}: expected a number of seconds above 0")
    return value


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
    tools: ToolsOption = None,
    mcp: McpOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    allow_env: AllowEnvOption = None,
    root: RootOption = None,
    executor: ExecutorOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """Run the runs queued in a PostgreSQL journal, under leases, until SIGTERM/SIGINT (then hand them back)."""
    with clean_errors(json_output):
        from planweave.workers import WorkerOptions, default_worker_name

        url = _queue_url(journal, "worker")
        toolbox = _toolbox(tools, workdir, allow_exec, allow_env, root)
        try:
            options = WorkerOptions(name or default_worker_name(), max_runs, lease, renew_every)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        # The plans are not known yet: with Ray installed, steps that say executor: ray go to Ray (as on resume).
        flags = ExecutorFlags(executor, ray_address, tuple(tools or ()))
        tally = asyncio.run(_work(url, options, toolbox, tuple(mcp or ()), concurrency, flags.executor()))
    if json_output:
        print_json({"status": "stopped", "worker": options.name, **tally})
    else:
        typer.echo(f"worker {options.name} stopped: {tally}", err=True)


async def _work(url: str, options: WorkerOptions, toolbox: Toolbox, mcp: tuple[str, ...], concurrency: int,
                executor: Executor) -> dict[str, Any]:
    from planweave.engine.runtime import Engine
    from planweave.workers import Worker

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        box = await open_mcp(stack, mcp, toolbox)
        journal, store = await stack.enter_async_context(_queue(url))
        engine = await stack.enter_async_context(Engine(journal, tools=box, concurrency=concurrency,
                                                            executor=executor))
        runner = Worker(engine, journal, store, options, tools=box, log=log)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, runner.stop)
        try:
            tally = await runner.serve()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
    return tally.as_dict()


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
        print_json({"journal": url, "runs": counts, "workers": [
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
