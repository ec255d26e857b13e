"""``planweave bench pressure``: deadline pressure against none, on seeded workflows with optional steps.

Each workflow (seeded) is a report: ``ingest``, then 3-5 ``analyse_i`` steps, then ``report``; beside them optional
work: a ``deep_i`` after each analysis and a ``polish`` after the report. Every step is a ``sleep`` of the engine's
virtual clock whose plan estimate is its median (1-4 s) and whose real duration is lognormal around it (sigma
:data:`SIGMA`), so a run is sometimes late without knowing it in advance. The engine runs two steps at once (optional
work competes for the slots). The deadline is a multiple of the reference (the makespan of the whole plan at its
medians, as the forecast computes it), from loose to tight; the run is cancelled when it passes.

Per deadline and policy it prints the fraction of runs that completed within the deadline, and the share of the
optional steps that were done anyway: without pressure, and with the ``drop_optional`` action at each threshold
(the run's live forecast refreshed after every outcome, the actions taken as the engine takes them). Runs are paired:
run ``i`` of every policy is the same workflow with the same durations.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line
from planweave.core.clock import VirtualClock, run_virtual

__all__ = ["DEADLINES", "SIGMA", "main", "run_bench", "workflow"]

SIGMA = 0.5
"""The lognormal spread of a step's real duration around its estimate."""

CONCURRENCY = 2
DEADLINES: tuple[tuple[str, float], ...] = (("loose", 1.5), ("moderate", 1.1), ("tight", 0.9), ("very tight", 0.7))


def workflow(seed: int) -> dict[str, Any]:
    """The seeded plan: required ``ingest`` -> ``analyse_i`` -> ``report``, optional ``deep_i`` and ``polish``."""
    rng = random.Random(f"pressure/{seed}")

    def step(sid: str, after: Sequence[str], optional: bool = False) -> dict[str, Any]:
        median = round(rng.uniform(1.0, 4.0), 3)
        seconds = round(median * math.exp(SIGMA * rng.gauss(0.0, 1.0)), 3)
        doc: dict[str, Any] = {"id": sid, "tool": "sleep", "args": {"seconds": seconds}, "after": list(after),
                               "estimate": {"duration": median}}
        if optional:
            doc["optional"] = True
        return doc

    analyses = [f"analyse_{i}" for i in range(rng.randint(3, 5))]
    steps = [step("ingest", [])]
    steps += [step(a, ["ingest"]) for a in analyses]
    steps += [step(f"deep_{i}", [a], optional=True) for i, a in enumerate(analyses)]
    steps += [step("report", analyses), step("polish", ["report"], optional=True)]
    return {"steps": steps}


def reference(plan: Mapping[str, Any]) -> float:
    """The makespan of ``plan`` at its estimates with the engine's concurrency (the forecast's exact schedule)."""
    from planweave.core.plan.graph import parse_plan_document, validate_plan
    from planweave.forecast.estimates import Estimates
    from planweave.forecast.simulate import forecast

    validated = validate_plan(parse_plan_document(plan, "bench"))
    return float(forecast(validated, Estimates(), runs=1, concurrency=CONCURRENCY).makespan.p50)


@dataclass(frozen=True, slots=True)
class Cell:
    """One policy under one deadline: runs, how many completed in time, the optional work done, the actions."""

    setting: str
    deadline_x: float
    policy: str
    runs: int
    completed: int
    fraction: float
    optional_done: float  # the share of optional steps that succeeded
    fired: int  # runs where pressure dropped steps


async def _one_run(seed: int, deadline_x: float, threshold: float | None, forecast_runs: int
                   ) -> tuple[bool, int, int, bool]:
    from planweave import builtin_tools, open_engine
    from planweave.allocate.pressure_watch import PressureWatch
    from planweave.core.plan.model import DeadlinePressure
    from planweave.engine.runtime import cancel_at_deadline
    from planweave.forecast.live import LiveOptions, start_live_forecast

    plan = workflow(seed)
    deadline = reference(plan) * deadline_x
    optional = [s["id"] for s in plan["steps"] if s.get("optional")]
    async with open_engine("memory://", clock=VirtualClock(), concurrency=CONCURRENCY,
                           tools=builtin_tools()) as engine:
        run = await engine.start(plan, run_id=f"p{seed}")
        cancel_at_deadline(engine, run, deadline)
        live = start_live_forecast(engine, run, LiveOptions(deadline=deadline, runs=forecast_runs, share=None,
                                                            concurrency=CONCURRENCY))
        watch = None
        if threshold is not None:
            watch = PressureWatch(run, DeadlinePressure(p_deadline=threshold, actions=("drop_optional",)))
        result = await run.wait()
        await (await live).wait()
    done = sum(1 for sid in optional if result.state.records[sid].status == "succeeded")
    return result.ok, done, len(optional), bool(watch is not None and watch.taken)


def run_bench(*, runs: int, thresholds: Sequence[float | None], forecast_runs: int = 100,
              deadlines: Sequence[tuple[str, float]] = DEADLINES, seed: int = 0) -> dict[str, Any]:
    """Run every policy (None: no pressure) on ``runs`` workflows under every deadline; return the cells."""
    cells: list[Cell] = []
    started = time.perf_counter()
    for name, dx in deadlines:
        for threshold in thresholds:
            completed, done, total, fired = 0, 0, 0, 0
            for i in range(runs):
                ok, d, t, f = run_virtual(_one_run(seed + i, dx, threshold, forecast_runs))
                completed += ok
                done += d
                total += t
                fired += f
            policy = "no pressure" if threshold is None else f"drop < {threshold:g}"
            cells.append(Cell(name, dx, policy, runs, completed, completed / runs, done / max(1, total), fired))
    return {"runs": runs, "forecast_runs": forecast_runs, "seed": seed, "sigma": SIGMA,
            "wall_s": round(time.perf_counter() - started, 2), "cells": [asdict(c) for c in cells]}


def render(result: Mapping[str, Any]) -> str:
    """Per deadline, each policy's fraction completed in time (and the share of optional steps done)."""
    cells = result["cells"]
    policies = list(dict.fromkeys(c["policy"] for c in cells))
    lines = [f"{result['runs']} runs per cell, {result['forecast_runs']} simulated runs per forecast, "
             f"durations lognormal (sigma {result['sigma']}) around the estimates, {result['wall_s']}s", "",
             "completed within the deadline (optional steps done)"]
    header = f"{'setting':<11} {'deadline':>8} " + " ".join(f"{p:>18}" for p in policies)
    lines += [header, "-" * len(header)]
    rows: dict[str, dict[str, Mapping[str, Any]]] = {}
    for c in cells:
        rows.setdefault(c["setting"], {})[c["policy"]] = c
    for setting, by_policy in rows.items():
        first = next(iter(by_policy.values()))
        lines.append(f"{setting:<11} {first['deadline_x']:>7}x " + " ".join(
            f"{by_policy[p]['fraction']:>10.2f} ({by_policy[p]['optional_done']:>4.0%})" for p in policies
            if p in by_policy))
    return "\n".join(lines)


def _thresholds(text: str) -> list[float | None]:
    found: list[float | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "off":
            found.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            value = float("nan")
        if not 0 < value <= 1:
            raise typer.BadParameter(f"'{part}' is not 'off' nor a probability above 0 and at most 1",
                                     param_hint="--thresholds")
        found.append(value)
    return found


def _command(
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per deadline and policy.")] = 20,
    thresholds: Annotated[str, typer.Option("--thresholds", help="Comma-separated: off (no pressure) or the "
                                                                 "p_deadline below which optional steps are dropped.")
                          ] = "off,0.5,0.8",
    forecast_runs: Annotated[int, typer.Option("--forecast-runs", min=20, help="Simulated runs per forecast.")
                             ] = 100,
    seed: Annotated[int, typer.Option("--seed", help="The first workflow's seed.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Deadline pressure (drop optional steps) against none, on seeded workflows on the virtual clock."""
    return run_bench(runs=runs, thresholds=_thresholds(thresholds), forecast_runs=forecast_runs, seed=seed), \
        json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench pressure")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
