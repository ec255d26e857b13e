"""``planweave bench ray``: steps on Ray measured against Ray itself and against the engine's own process.

Three questions, each answered with a baseline run in the same process on the same cluster:

1. **Per-step overhead.** A chain of no-op steps (each waits for the one before: per-step latency) and a fan-out
   (throughput), run by planweave with :class:`~planweave.executors.ray.RayExecutor`, beside Ray's own bare tasks
   doing the same: a plain task per step, and a streaming-generator task per step (what the executor submits).
2. **Latency DAGs.** The random and uneven sleeping DAGs of :mod:`planweave.bench.workloads`: makespan against the
   critical path, for planweave in-process, planweave on Ray and bare Ray tasks with ObjectRef dependencies
   (sleeping steps claim no CPU in all Ray runs: ``num_cpus=0``).
3. **CPU-bound steps.** A fan-out of pure-Python steps that burn a fixed amount of CPU: in-process threads share
   one GIL, Ray's worker processes do not.

A cluster is started for the run (``ray start --head --num-cpus N`` in a temp dir, stopped by its own pids) unless
``--address`` names one. Every system is warmed up once (Ray starts worker processes on demand) before it is timed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from planweave.bench.workloads import Workload, fan_out, latency_random, plan_document, uneven
from planweave.engine.executor import Executor, InProcessExecutor
from planweave.engine.runtime import Engine
from planweave.extras import require
from planweave.journal.memory import MemoryJournal
from planweave.tools import Toolbox, builtin_tools


@dataclass(frozen=True)
class Settings:
    chain: int = 100
    fan_out: int = 200
    random_steps: int = 60
    uneven_layers: int = 6
    cpu_steps: int = 4
    cpu_loops: int = 3_000_000
    num_cpus: int = 2
    address: str | None = None
    latency: bool = True  # the latency DAGs (slow on Ray: a worker process per concurrent sleeping step)


# -- tools and bare Ray task bodies (top level: Ray workers import them) ------------------------------------------
def burn(loops: int) -> int:
    """Spin ``loops`` iterations of pure Python (holds the GIL throughout); a sync tool."""
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total


def bench_tools() -> Toolbox:
    box = builtin_tools()
    box.add(burn, idempotent=True)
    return box


def _bare_noop(*parents: Any) -> None:
    """A bare Ray task: nothing."""


def _bare_stream() -> Any:
    """A bare Ray streaming-generator task: one item."""
    yield None


def _bare_sleep(seconds: float, *parents: Any) -> None:
    time.sleep(seconds)


def _bare_burn(loops: int, *parents: Any) -> int:
    return burn(loops)


# -- measuring ----------------------------------------------------------------------------------------------------
async def _planweave(doc: Mapping[str, Any], executor: Executor, tools: Toolbox) -> float:
    """Seconds from start to end of one planweave run of ``doc`` (memory journal: the executor is what differs)."""
    async with Engine(MemoryJournal(), tools=tools, executor=executor, concurrency=None) as engine:
        t0 = time.perf_counter()
        run = await engine.start(doc)
        result = await run.wait()
        took = time.perf_counter() - t0
    if not result.ok:
        raise RuntimeError(f"the benchmark run failed: {result.error}")
    return took


def chain_document(steps: int) -> dict[str, Any]:
    return {"steps": [{"id": f"s{i}", "tool": "noop", **({"after": [f"s{i - 1}"]} if i else {})}
                      for i in range(steps)]}


def cpu_document(steps: int, loops: int) -> dict[str, Any]:
    return {"steps": [*({"id": f"c{i}", "tool": "burn", "args": {"loops": loops}} for i in range(steps)),
                      {"id": "join", "tool": "noop", "after": [f"c{i}" for i in range(steps)]}]}


class BareRay:
    """Ray's own tasks for the same work (the baseline of every Ray figure)."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.noop = ray.remote(_bare_noop)
        self.noop_free = ray.remote(num_cpus=0)(_bare_noop)
        self.stream = ray.remote(num_returns="streaming")(_bare_stream)
        self.sleep = ray.remote(num_cpus=0)(_bare_sleep)
        self.burn = ray.remote(_bare_burn)

    async def chain(self, steps: int, streaming: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            if streaming:
                async for item in self.stream.remote():
                    await item
            else:
                await self.noop.remote()
        return time.perf_counter() - t0

    async def fan_out(self, steps: int, streaming: bool) -> float:
        async def one() -> None:
            if streaming:
                async for item in self.stream.remote():
                    await item
            else:
                await self.noop.remote()

        t0 = time.perf_counter()
        await self.noop.remote()
        await asyncio.gather(*(one() for _ in range(steps - 2)))
        await self.noop.remote()
        return time.perf_counter() - t0

    async def dag(self, workload: Workload) -> float:
        t0 = time.perf_counter()
        refs: dict[str, Any] = {}
        for sid, parents in workload.deps.items():
            refs[sid] = self.sleep.remote(workload.durations.get(sid, 0.0), *(refs[p] for p in parents))
        await asyncio.gather(*(refs[s] for s in workload.sinks))
        return time.perf_counter() - t0

    async def cpu(self, steps: int, loops: int) -> float:
        t0 = time.perf_counter()
        parts = [self.burn.remote(loops) for _ in range(steps)]
        await self.noop_free.remote(*parts)
        return time.perf_counter() - t0


async def _best(measure: Callable[[], Awaitable[float]], repeats: int) -> float:
    """The fastest of ``repeats`` timed runs, after one untimed warm-up."""
    await measure()
    return min([await measure() for _ in range(repeats)])


async def measure(settings: Settings, ray: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every figure of the benchmark, on the connected Ray (see the module docstring)."""
    from planweave.executors.ray import RayExecutor

    tools = bench_tools()
    bare = BareRay(ray)
    on_ray = RayExecutor()  # steps claim one CPU (Ray's default)
    on_ray_free = RayExecutor(num_cpus=0)  # sleeping steps claim none, as the bare sleeping tasks
    results: dict[str, Any] = {"settings": settings.__dict__, "overhead": [], "latency": [], "cpu": []}

    n = settings.chain
    progress(f"chain of {n} no-op steps")
    chain = {
        "Ray task": await _best(lambda: bare.chain(n, streaming=False), 2),
        "Ray streaming task": await _best(lambda: bare.chain(n, streaming=True), 2),
        "planweave on Ray": await _best(lambda: _planweave(chain_document(n), on_ray, tools), 2),
        "planweave in-process": await _best(lambda: _planweave(chain_document(n), InProcessExecutor(), tools), 2),
    }
    results["overhead"].append({"workload": f"chain {n}", "steps": n,
                                "per_step_ms": {k: 1000 * v / n for k, v in chain.items()}})
    n = settings.fan_out
    progress(f"fan-out of {n} no-op steps")
    wide = fan_out(n)
    fan = {
        "Ray task": await _best(lambda: bare.fan_out(n, streaming=False), 2),
        "Ray streaming task": await _best(lambda: bare.fan_out(n, streaming=True), 2),
        "planweave on Ray": await _best(lambda: _planweave(plan_document(wide), on_ray, tools), 2),
        "planweave in-process": await _best(lambda: _planweave(plan_document(wide), InProcessExecutor(), tools), 2),
    }
    results["overhead"].append({"workload": f"fan-out {n}", "steps": n,
                                "per_step_ms": {k: 1000 * v / n for k, v in fan.items()}})

    latency = (latency_random(settings.random_steps), uneven(settings.uneven_layers)) if settings.latency else ()
    for workload in latency:
        progress(f"latency DAG: {workload.name}")
        doc = plan_document(workload)
        makespans = {
            "Ray tasks (ObjectRef deps)": await _best(partial(bare.dag, workload), 1),
            "planweave on Ray": await _best(partial(_planweave, doc, on_ray_free, tools), 1),
            "planweave in-process": await _best(partial(_planweave, doc, InProcessExecutor(), tools), 1),
        }
        results["latency"].append({"workload": workload.name, "steps": len(workload),
                                   "critical_path_s": workload.critical_path, "makespan_s": makespans})

    steps, loops = settings.cpu_steps, settings.cpu_loops
    progress(f"CPU-bound fan-out: {steps} steps of {loops:,} loops")
    doc = cpu_document(steps, loops)
    t0 = time.perf_counter()
    burn(loops)
    one = time.perf_counter() - t0
    alone = await _best(lambda: bare.cpu(1, loops), 1)
    cpu = {
        "Ray tasks": await _best(lambda: bare.cpu(steps, loops), 1),
        "planweave on Ray": await _best(lambda: _planweave(doc, on_ray, tools), 1),
        "planweave in-process (threads)": await _best(lambda: _planweave(doc, InProcessExecutor(), tools), 1),
    }
    # How many steps Ray really ran at once: this machine may give its worker processes fewer cores than it has.
    parallel = steps * alone / cpu["Ray tasks"]
    results["cpu"].append({"workload": f"{steps} x burn({loops:,})", "one_step_s": one, "one_ray_task_s": alone,
                           "ray_parallelism": parallel, "makespan_s": cpu})
    await on_ray.aclose()
    await on_ray_free.aclose()
    return results


def run_bench(settings: Settings, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start (or join) a cluster, connect, measure, stop what was started; return the figures."""
    require("ray", "planweave bench ray")
    import ray
    from planweave.testing.ray_cluster import LocalRayCluster

    cluster = None if settings.address else LocalRayCluster(num_cpus=settings.num_cpus)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        address = settings.address or (cluster.start() if cluster is not None else None)
        progress(f"Ray at {address}")
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        try:
            results = asyncio.run(measure(settings, ray, progress))
        finally:
            ray.shutdown()
    finally:
        if cluster is not None:
            cluster.stop()
    results["ray"] = ray.__version__
    results["cpus"] = os.cpu_count()
    return results


def render(results: Mapping[str, Any]) -> str:
    """The figures as three tables, each with ratios against its baseline (the first column)."""
    lines = [f"Ray {results.get('ray')} · {results.get('cpus')} CPUs on this machine · cluster --num-cpus "
             f"{results['settings']['num_cpus']}", "", "per-step overhead (ms per step; x = against a bare Ray task)"]
    for row in results["overhead"]:
        base = row["per_step_ms"]["Ray task"]
        cells = "  ".join(f"{k}: {v:.2f} ({v / base:.2f}x)" for k, v in row["per_step_ms"].items())
        lines.append(f"  {row['workload']:<14} {cells}")
    lines += ["", "latency DAGs (makespan s; x = against the critical path)"]
    for row in results["latency"]:
        cp = row["critical_path_s"]
        cells = "  ".join(f"{k}: {v:.3f} ({v / cp:.2f}x)" for k, v in row["makespan_s"].items())
        lines.append(f"  {row['workload']:<22} critical path {cp:.3f}  {cells}")
    lines += ["", "CPU-bound fan-out (makespan s; x = against in-process threads)"]
    for row in results["cpu"]:
        base = row["makespan_s"]["planweave in-process (threads)"]
        cells = "  ".join(f"{k}: {v:.2f} ({v / base:.2f}x)" for k, v in row["makespan_s"].items())
        lines.append(f"  {row['workload']:<22} one step alone {row['one_step_s']:.2f}  {cells}  (Ray ran "
                     f"{row['ray_parallelism']:.1f} steps at once)")
    return "\n".join(lines)
