"""The per-step cost of speculation on no-op plans (docs/benchmarks.md, "Speculation overhead").

A layered DAG of no-op steps (``planweave bench engine``'s workload: ``after:`` edges, nothing to predict) run with
speculation off, safe and eager on the memory journal; per step: the CPU time of the process over the run's steps
(the engine is one thread; CPU time is robust to other load on the machine), best of ``--repeats`` runs, each mode
measured ``--rounds`` times interleaved (load drift hits every mode alike). Also chains where every step references
its parent and every other one carries a right ``predict:`` (speculation has work to do).

    .venv/bin/python benchmarks/speculation_overhead.py [--steps 10000] [--repeats 3] [--rounds 3]
    .venv/bin/python benchmarks/speculation_overhead.py --profile safe   # cProfile of one safe run, top 25
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import time
from enum import StrEnum
from typing import Annotated, Any

import typer

from planweave import builtin_tools, open_engine
from planweave.bench.workloads import layered, plan_document
from planweave.core.plan.graph import parse_plan_document
from planweave.core.plan.model import PlanSpec


def noop_plan(steps: int) -> PlanSpec:
    return parse_plan_document(plan_document(layered(steps)), "layered")


def predicted_chain_plan(steps: int) -> PlanSpec:
    """Chains of 10 no-op steps, each referencing its parent's output; every other step has a right ``predict:``."""
    doc: list[dict[str, Any]] = []
    for i in range(steps):
        step: dict[str, Any] = {"id": f"s{i}", "tool": "noop", "args": {"i": i}}
        if i % 10:
            step["args"]["parent"] = f"${{s{i - 1}.i}}"
        if i % 2 == 0:
            step["predict"] = {"i": i, **({"parent": i - 1} if i % 10 else {})}
        doc.append(step)
    return parse_plan_document({"steps": doc}, "predicted")


async def once(spec: PlanSpec, mode: str) -> float:
    async with open_engine("memory://", tools=builtin_tools(), concurrency=None) as engine:
        started = time.process_time()  # CPU time: the engine is one thread, and the machine may be loaded
        run = await engine.start(spec, speculation=mode)  # type: ignore[arg-type]
        result = await run.wait()
        elapsed = time.process_time() - started
        assert result.ok, result.error
    return elapsed


def measure(spec: PlanSpec, modes: list[str], repeats: int, rounds: int) -> dict[str, list[float]]:
    """µs per step, best of ``repeats``, per round, per mode (rounds interleaved)."""
    n = len(spec.steps)
    out: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            best = min(asyncio.run(once(spec, mode)) for _ in range(repeats))
            out[mode].append(round(best / n * 1e6, 1))
    return out


class Mode(StrEnum):
    off = "off"
    safe = "safe"
    eager = "eager"


def main(
    steps: Annotated[int, typer.Option(min=1)] = 10_000,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    rounds: Annotated[int, typer.Option(min=1)] = 3,
    profile: Annotated[Mode | None, typer.Option(help="cProfile one run of this mode instead")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> None:
    """What speculation costs per step when nothing can be predicted, and what it saves on predicted chains."""
    spec = noop_plan(steps)
    if (profile.value if profile else None):
        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(once(spec, (profile.value if profile else None)))
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    modes = ["off", "safe", "eager"]
    rows = {"noop layered": measure(spec, modes, repeats, rounds),
            "predicted chains": measure(predicted_chain_plan(steps), modes, repeats, rounds)}
    if json_output:
        print(json.dumps({"steps": steps, "us_per_step": rows}))
        return
    print(f"µs per step, {steps:,} no-op steps, best of {repeats}, {rounds} rounds")
    for name, by_mode in rows.items():
        off = by_mode["off"]
        for mode, values in by_mode.items():
            ratios = [round(v / o, 2) for v, o in zip(values, off, strict=True)]
            print(f"  {name:17} {mode:5} {values}  ratio to off {ratios}")


if __name__ == "__main__":
    typer.run(main)
