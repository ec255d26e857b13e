"""In-process A/B of the engine's big-run freeze (engine/collector.py; docs/benchmarks.md, "the collector off a big
run"): the same 10,000-step plan on ``Engine(gc_freeze_every=None)`` (no policy: what a single run got before) and on
the default policy (a run of at least 1,000 steps freezes the heap at its start), alternating, beside the asyncio
floor of ``planweave bench engine``.

    python benchmarks/gc_freeze_ab.py [null://|sqlite] [--steps 10000] [--repeats 5] [--shapes fan,layered]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time

from planweave import Engine, builtin_tools
from planweave.bench.peers import run_floor
from planweave.bench.workloads import Workload, fan_out, layered, plan_document
from planweave.journal import open_journal
from planweave.plan import parse_plan_document


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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("journal", nargs="?", default="null://", help="null:// or sqlite (a fresh file per run)")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default="fan,layered")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        workload = fan_out(args.steps) if shape == "fan" else layered(args.steps)
        times: dict[str, list[float]] = {"floor": [], "off": [], "freeze": []}
        for _ in range(args.repeats):
            for mode in times:
                times[mode].append(await _once(args.journal, mode, workload))
        med = {mode: statistics.median(t) / args.steps * 1e6 for mode, t in times.items()}
        print(f"{args.journal} {workload.name}: median us/step floor {med['floor']:.1f}, policy off "
              f"{med['off']:.1f} ({med['off'] / med['floor']:.2f}x), big-run freeze {med['freeze']:.1f} "
              f"({med['freeze'] / med['floor']:.2f}x); freeze/off {med['freeze'] / med['off']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
