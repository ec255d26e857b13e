"""In-process A/B of the engine's big-run freeze (engine/collector.py; docs/benchmarks.md, "the collector off a big
run"): the same 10,000-step plan on ``Engine(gc_freeze_every=None)`` (no policy: what a single run got before) and on
the default policy (a run of at least 1,000 steps freezes the heap at its start), alternating, beside the asyncio
floor of ``planweave bench engine``.

    python benchmarks/gc_freeze_ab.py [null://|sqlite] [--steps 10000] [--repeats 5] [--shapes fan,layered]
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import tempfile
import time
from typing import Annotated

import typer

from planweave import Engine, builtin_tools
from planweave.bench.peers import run_floor
from planweave.bench.workloads import Workload, fan_out, layered, plan_document
from planweave.core.plan import parse_plan_document
from planweave.journal import open_journal


async def _once(url: str, mode: str, workload: Workload) -> float:
    gc.collect()
    if mode == "floor":
        started = time.perf_counter()
        await run_floor(workload.deps)
        return time.perf_counter() - started
    spec = parse_plan_document(plan_document(workload), workload.name)
    if url == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp()}/runs.db"
    async with open_journal(url) as journal, Engine(journal, tools=builtin_tools(), concurrency=None,
                                                    gc_freeze_every=1000 if mode == "freeze" else None) as engine:
        warm = parse_plan_document(plan_document(fan_out(100)), "warm-up")
        await (await engine.start(warm, source="warm-up")).wait()
        gc.collect()
        started = time.perf_counter()
        result = await (await engine.start(spec, source=workload.name)).wait()
        elapsed = time.perf_counter() - started
        assert result.ok, result
        return elapsed


async def measure(journal: str, steps: int, repeats: int, shapes: str) -> None:
    for shape in shapes.split(","):
        workload = fan_out(steps) if shape == "fan" else layered(steps)
        times: dict[str, list[float]] = {"floor": [], "off": [], "freeze": []}
        for _ in range(repeats):
            for mode in times:
                times[mode].append(await _once(journal, mode, workload))
        med = {mode: statistics.median(t) / steps * 1e6 for mode, t in times.items()}
        print(f"{journal} {workload.name}: median us/step floor {med['floor']:.1f}, policy off "
              f"{med['off']:.1f} ({med['off'] / med['floor']:.2f}x), big-run freeze {med['freeze']:.1f} "
              f"({med['freeze'] / med['floor']:.2f}x); freeze/off {med['freeze'] / med['off']:.2f}")


def main(
    journal: Annotated[str, typer.Argument(help="null:// or sqlite (a fresh file per run)")] = "null://",
    steps: Annotated[int, typer.Option(min=1)] = 10_000,
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    shapes: Annotated[str, typer.Option(help="comma-separated: fan, layered")] = "fan,layered",
) -> None:
    """A/B of the collector policy (freeze for big runs) against the asyncio floor, median us per step."""
    asyncio.run(measure(journal, steps, repeats, shapes))


if __name__ == "__main__":
    typer.run(main)
