"""``planweave bench ...``: the benchmarks, each imported only when asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sized
from pathlib import Path
from typing import Annotated

import typer

from planweave.cli.common import (
    ExitCode,
    JsonOption,
    clean_errors,
    print_json,
)

bench_app = typer.Typer(help="Benchmarks: AsyncHow makespans, engine overhead, planning, scale.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``bench`` group to ``app``."""
    app.add_typer(bench_app, name="bench")


@bench_app.command("asynchow")
def bench_asynchow(
    directory: Annotated[Path, typer.Argument(help="The AsyncHow data set directory.", show_default=False)],
    json_output: JsonOption = False,
) -> None:
    """Run every AsyncHow plan on the virtual clock and count the makespans inside the gold interval."""
    try:
        from planweave.bench.asynchow import run_asynchow
    except ImportError as exc:
        typer.echo(f"error: the AsyncHow benchmark is not available: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    with clean_errors():
        result = run_asynchow(directory)
    if json_output:
        print_json(result)
        return
    total = int(result.get("total", 0))
    exact = int(result.get("exact", 0))
    mismatches = result.get("mismatches", [])
    n_mismatches = len(mismatches) if isinstance(mismatches, Sized) else int(mismatches)
    share = f" ({100.0 * exact / total:.1f}%)" if total else ""
    seconds = float(result.get("seconds", 0.0))
    typer.echo(f"asynchow: {exact}/{total} makespans inside the gold interval{share}, {n_mismatches} mismatches, "
               f"{seconds:.2f}s")


@bench_app.command(
    "planning",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_planning(ctx: typer.Context) -> None:
    """Streaming admission and concurrent re-planning vs whole-plan, synchronous and ReAct (options: --help)."""
    from planweave.bench.planning import main as planning_main

    raise typer.Exit(planning_main(list(ctx.args)))


@bench_app.command(
    "engine",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_engine(ctx: typer.Context) -> None:
    """Measure engine overhead; every option (--json, --help, ...) goes to planweave.bench.engine."""
    try:
        # By name: the benchmark module is optional, and imported only when asked for (it is heavier).
        module = importlib.import_module("planweave.bench.engine")
    except ImportError as exc:
        typer.echo(f"error: the engine benchmark is not available: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    bench_main: Callable[[list[str]], int] = module.main
    raise typer.Exit(bench_main(list(ctx.args)))


@bench_app.command(
    "scale",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_scale(ctx: typer.Context) -> None:
    """Many runs in one process vs asyncio tasks, or (--listing) listing a big journal; options go to
    planweave.bench.scale (--help)."""
    from planweave.bench.scale import main as scale_main

    raise typer.Exit(scale_main(list(ctx.args)))


@bench_app.command("ray")
def bench_ray(
    chain: Annotated[int, typer.Option("--chain", min=2, help="No-op steps in the chain (per-step latency).")] = 100,
    fan_out: Annotated[int, typer.Option("--fan-out", min=3, help="No-op steps in the fan-out (throughput).")] = 200,
    cpu_steps: Annotated[int, typer.Option("--cpu-steps", min=1, help="CPU-bound steps in parallel.")] = 4,
    cpu_loops: Annotated[int, typer.Option("--cpu-loops", min=1, help="Pure-Python loops per CPU-bound step.")
                         ] = 3_000_000,
    num_cpus: Annotated[int, typer.Option("--num-cpus", min=1, help="CPUs of the cluster it starts.")] = 2,
    address: Annotated[str | None, typer.Option(
        "--address", metavar="ADDR", help="A running cluster to use (default: start one, stop it after).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Steps on Ray against Ray's own tasks: per-step overhead, latency DAGs, CPU-bound steps vs threads."""
    with clean_errors(json_output):
        from planweave.bench.ray_steps import Settings, render, run_bench

        settings = Settings(chain=chain, fan_out=fan_out, cpu_steps=cpu_steps, cpu_loops=cpu_loops,
                            num_cpus=num_cpus, address=address)
        results = run_bench(settings, progress=lambda message: typer.echo(message, err=True))
    if json_output:
        print_json(results)
    else:
        typer.echo(render(results))


@bench_app.command(
    "workers",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_workers(ctx: typer.Context) -> None:
    """Runs through worker processes on a PostgreSQL journal vs one engine, and a takeover after SIGKILL; options
    go to planweave.bench.workers (--help)."""
    from planweave.bench.workers import main as workers_main

    raise typer.Exit(workers_main(list(ctx.args)))


@bench_app.command(
    "admission",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_admission(ctx: typer.Context) -> None:
    """Many runs over one congested model endpoint: fixed semaphore vs adaptive window with priority; options go
    to planweave.bench.admission (--help)."""
    from planweave.bench.admission import main as admission_main

    raise typer.Exit(admission_main(list(ctx.args)))


@bench_app.command(
    "allocate",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_allocate(ctx: typer.Context) -> None:
    """Cheapest, strongest, greedy and Monte Carlo allocation of synthetic CodeFlow/ProofFlow runs under budgets
    and deadlines from loose to tight; options go to planweave.bench.allocate (--help)."""
    from planweave.bench.allocate import main as allocate_main

    raise typer.Exit(allocate_main(list(ctx.args)))


@bench_app.command(
    "pressure",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_pressure(ctx: typer.Context) -> None:
    """Deadline pressure (optional steps dropped when the forecast is late) against none, on seeded workflows from
    loose to tight deadlines; options go to planweave.bench.pressure (--help)."""
    from planweave.bench.pressure import main as pressure_main

    raise typer.Exit(pressure_main(list(ctx.args)))


@bench_app.command(
    "cache",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_cache(ctx: typer.Context) -> None:
    """The result cache on SQLite: a second run of cacheable slow steps with and without it, and what a miss lookup
    costs per step; options go to planweave.bench.cache (--help)."""
    from planweave.bench.cache import main as cache_main

    raise typer.Exit(cache_main(list(ctx.args)))


@bench_app.command(
    "speculate",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_speculate(ctx: typer.Context) -> None:
    """Speculative steps off, safe and eager on seeded llm DAGs (scripted server) with predictions right with p in
    {0, 0.3, 0.6, 0.9}: latency, extra calls and cost, discarded attempts, results that differ (always 0); options
    go to planweave.bench.speculate (--help)."""
    from planweave.bench.speculate import main as speculate_main

    raise typer.Exit(speculate_main(list(ctx.args)))


@bench_app.command(
    "control",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_control(ctx: typer.Context) -> None:
    """Synchronous vs asynchronous control (drop_expired, rollforward) at 50/150/400 ms latency (options: --help)."""
    from planweave.bench.control import main as control_main

    raise typer.Exit(control_main(list(ctx.args)))


@bench_app.command(
    "rollouts",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_rollouts(ctx: typer.Context) -> None:
    """Synchronous RL batches vs the asynchronous rollout engine (max_staleness 0, 1, 2, 4) on the scripted server
    with long-tailed episodes: trajectories/s, trainer idle fraction, staleness; options go to
    planweave.bench.rollouts (--help)."""
    from planweave.bench.rollouts import main as rollouts_main

    raise typer.Exit(rollouts_main(list(ctx.args)))


@bench_app.command(
    "context",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_context(ctx: typer.Context) -> None:
    """Planner prompt tokens per re-plan at 100, 1,000 and 5,000 finished steps: the context by reference vs the
    state summary, on the scripted server; options go to planweave.bench.context (--help)."""
    from planweave.bench.context import main as context_main

    raise typer.Exit(context_main(list(ctx.args)))


@bench_app.command(
    "memory",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_memory(ctx: typer.Context) -> None:
    """Memory across runs on a seeded family of related goals (scripted planner told by its prompt whether a
    recalled skill applies): steps and tokens per goal with memory on vs off, and retrieval precision@k on a
    labelled set; options go to planweave.bench.memory (--help)."""
    from planweave.bench.memory import main as memory_main

    raise typer.Exit(memory_main(list(ctx.args)))


@bench_app.command(
    "forecast",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_forecast(ctx: typer.Context) -> None:
    """How true the forecast's chance of success is: Brier scores on held-out runs of seeded plans against a naive
    base rate, each plan's own rate and the earlier flat prior; options go to planweave.bench.forecast_calibration
    (--help)."""
    from planweave.bench.forecast_calibration import main as forecast_main

    raise typer.Exit(forecast_main(list(ctx.args)))


@bench_app.command(
    "durability",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_durability(ctx: typer.Context) -> None:
    """SIGKILL a fan-out of side-effecting steps at seeded points on planweave, LangGraph and DBOS, resume, and count
    duplicated and lost effects; options go to planweave.bench.durability (--help)."""
    from planweave.bench.durability import main as durability_main

    raise typer.Exit(durability_main(list(ctx.args)))


@bench_app.command(
    "storm",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_storm(ctx: typer.Context) -> None:
    """Parallel model calls against a provider with tokens-per-minute and concurrency limits (429 + Retry-After,
    calls cut mid-stream): planweave vs the openai SDK, LangGraph and Pydantic AI; options go to
    planweave.bench.storm (--help)."""
    from planweave.bench.storm import main as storm_main

    raise typer.Exit(storm_main(list(ctx.args)))


@bench_app.command(
    "caps",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_caps(ctx: typer.Context) -> None:
    """Runs that would spend past a dollar cap (priced and unpriced models, cut calls, parallel calls): what each
    system spends against its cap, planweave vs Pydantic AI, LangGraph and the OpenAI Agents SDK; options go to
    planweave.bench.caps (--help)."""
    from planweave.bench.caps import main as caps_main

    raise typer.Exit(caps_main(list(ctx.args)))
