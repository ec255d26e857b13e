"""Forecast figures for docs/benchmarks.md: forecast time (N simulated runs) on a 100-step plan and on AsyncHow plans,
the same runs through the real engine on the virtual clock, and the overhead of a live forecast on a run.

    .venv/bin/python benchmarks/forecast_bench.py [--asynchow ../shared/data/asynchow] [--repeat 3]
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.bench.asynchow import load_instances
from planweave.bench.workloads import plan_document
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.forecast.estimates import Estimates, Observation, build_estimates
from planweave.forecast.live import LiveForecast, LiveOptions
from planweave.forecast.simulate import forecast


def random_plan(steps: int, seed: int = 1, tool: str = "sleep", seconds: float = 1.0) -> dict[str, Any]:
    """A random DAG: each step after up to 3 earlier ones, a sleep of ``seconds`` with an estimate of 1-9 s."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        parents = rng.sample([f"s{j}" for j in range(max(0, i - 20), i)], min(i, rng.randint(0, 3)))
        args: dict[str, Any] = {"seconds": seconds} if tool == "sleep" else {"i": i}
        out.append({"id": f"s{i}", "tool": tool, "args": args, "after": parents,
                    "estimate": {"duration": round(rng.uniform(1, 9), 2), "cost": 0.01},
                    "retries": {"max": 2, "backoff": 1.0}})
    return {"steps": out}


def layered(layers: int, width: int, seconds: float) -> dict[str, Any]:
    """``layers`` layers of ``width`` sleeps of ``seconds``, each step after every step of the layer before."""
    steps = []
    for layer in range(layers):
        before = [f"l{layer - 1}_{j}" for j in range(width)] if layer else []
        steps += [{"id": f"l{layer}_{j}", "tool": "sleep", "args": {"seconds": seconds}, "after": before,
                   "estimate": {"duration": seconds}} for j in range(width)]
    return {"steps": steps}


def history(seed: int = 2) -> Estimates:
    """A history of 500 attempts of the sleep tool: lognormal durations (median 4 s), 10% failures."""
    rng = random.Random(seed)
    return build_estimates(Observation("tool", "sleep", rng.lognormvariate(math.log(4), 0.6), rng.random() > 0.1,
                                       cost_usd=0.01) for _ in range(500))


def timed(fn: Any, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def show(label: str, seconds: list[float]) -> None:
    median = statistics.median(seconds) * 1000
    print(f"{label}: " + ", ".join(f"{s * 1000:.0f} ms" for s in seconds) + f" (median {median:.0f} ms)")


def engine_runs(doc: dict[str, Any], runs: int) -> None:
    """``runs`` runs of ``doc`` one after the other through the real engine on the virtual clock (null journal)."""

    async def go() -> None:
        async with open_engine("null://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            for _ in range(runs):
                await (await engine.start(doc)).wait()

    run_virtual(go())


def live_run(doc: dict[str, Any], options: LiveOptions | None, table: Estimates) -> tuple[float, int]:
    """One run of ``doc`` on the real clock (memory journal), forecast live with ``options`` (None: not)."""

    async def go() -> tuple[float, int]:
        async with open_engine("memory://", tools=builtin_tools()) as engine:
            began = time.perf_counter()
            run = await engine.start(doc)
            live = LiveForecast(run, engine.clock, table, options) if options is not None else None
            if live is not None:
                live.request()
            await run.wait()
            return time.perf_counter() - began, live.refreshes if live else 0

    return asyncio.run(go())


def main(
    asynchow: Annotated[Path, typer.Option(help="The AsyncHow files.")] = Path("../shared/data/asynchow"),
    repeat: Annotated[int, typer.Option(min=1)] = 3,
    runs: Annotated[int, typer.Option(min=1)] = 1000,
    live_only: Annotated[bool, typer.Option("--live-only", help="Only the live forecast's overhead.")] = False,
) -> None:
    table = history()
    if not live_only:
        offline(asynchow, repeat, runs, table)
        history_read(repeat)
    live_overhead(repeat, table)


def offline(asynchow: Path, repeat: int, runs: int, table: Estimates) -> None:
    plan = validate_plan(parse_plan_document(random_plan(100), "random"))
    show(f"forecast N={runs}, 100-step plan, fixed estimates", timed(lambda: forecast(plan, Estimates(), runs=runs),
                                                                   repeat))
    show(f"forecast N={runs}, 100-step plan, lognormal history + retries",
         timed(lambda: forecast(plan, table, runs=runs, deadline=60), repeat))
    show("real engine on the virtual clock, 100 runs of the 100-step plan (null journal)",
         timed(lambda: engine_runs(random_plan(100), 100), repeat))
    show("forecast N=100 of the same (history)", timed(lambda: forecast(plan, table, runs=100), repeat))

    instances = load_instances(asynchow)
    biggest = max(instances, key=lambda i: len(i.durations))
    big: Plan = validate_plan(parse_plan_document(plan_document(biggest.workload()), "asynchow"))
    result = forecast(big, Estimates(), runs=runs, concurrency=None)
    print(f"AsyncHow largest plan ({len(big)} steps, {biggest.title!r}): makespan p50 {result.makespan.p50:g} s, "
          f"critical path {big.makespan_lower_bound:g} s")
    show(f"forecast N={runs}, AsyncHow largest plan", timed(lambda: forecast(big, Estimates(), runs=runs,
                                                                              concurrency=None), repeat))
    plans = [validate_plan(parse_plan_document(plan_document(i.workload()), "asynchow")) for i in instances]
    exact = sum(forecast(p, Estimates(), runs=1, concurrency=None).makespan.p50 == p.makespan_lower_bound
                for p in plans)
    print(f"AsyncHow: {exact}/{len(plans)} plans forecast exactly at their critical path (fixed durations)")
    sample = plans[:: max(1, len(plans) // 200)]
    spent = timed(lambda: [forecast(p, Estimates(), runs=runs, concurrency=None) for p in sample], 1)[0]
    print(f"AsyncHow: N={runs} over {len(sample)} plans: {spent / len(sample) * 1000:.1f} ms per plan")


def history_read(repeat: int) -> None:
    """How long the estimates table of a journal of 100 runs of the 100-step plan (10,000 attempts) takes."""
    from planweave.forecast.history import read_estimates
    from planweave.journal.memory import MemoryJournal

    async def fill() -> MemoryJournal:
        journal = MemoryJournal()
        async with open_engine(journal, clock=VirtualClock(), tools=builtin_tools()) as engine:
            for _ in range(100):
                await (await engine.start(random_plan(100))).wait()
        return journal

    journal = run_virtual(fill())
    show("estimates table of a journal of 100 runs x 100 steps (memory)",
         timed(lambda: asyncio.run(read_estimates(journal)), repeat))


def live_overhead(repeat: int, table: Estimates) -> None:

    overhead_doc = random_plan(400, tool="noop")
    for label, options in (("off", None), ("on (share 5%)", LiveOptions(deadline=60, runs=200)),
                           ("on, every outcome (no throttle)", LiveOptions(deadline=60, runs=200, share=None))):
        figures = [live_run(overhead_doc, options, table) for _ in range(repeat)]
        print(f"400-step noop run, live forecast {label}: " + ", ".join(f"{s * 1000:.0f} ms ({n} refreshes)"
                                                                       for s, n in figures))
    for name, doc in (("100-step run of 20 ms sleeps", random_plan(100, seconds=0.02)),
                      ("20 layers x 10 sleeps of 0.1 s", layered(20, 10, 0.1))):
        for label, options in (("off", None), ("on (share 5%)", LiveOptions(deadline=60, runs=200))):
            figures = [live_run(doc, options, table) for _ in range(repeat)]
            print(f"{name}, live forecast {label}: " + ", ".join(
                f"{s * 1000:.0f} ms ({n} refreshes)" for s, n in figures))


if __name__ == "__main__":
    typer.run(main)
