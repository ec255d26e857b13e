"""Whole-process figures for a big plan file: ``planweave run big.yaml`` wall time, and plan parsing per step.

Writes a plan file of ``--steps`` no-op steps (the engine benchmark's layered DAG, seed 1: 20 layers, 1-3 parents
per step), then runs ``planweave run FILE --json`` as a real process ``--repeats`` times per journal (``null://`` and
a fresh SQLite file each time), and prints the median wall time, the process's start-up (``planweave run`` of a
one-step plan) and, in this process, what reading and parsing the file costs per step (the CLI's
:func:`planweave.planfile.load_plan_file`: YAML, the document checks, the ``PlanSpec``) and ``validate_plan``.

    python benchmarks/big_plan.py [--steps 10000] [--repeats 3] [--keep big.yaml]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml

from planweave.bench.workloads import layered, plan_document
from planweave.core.plan.graph import validate_plan
from planweave.tools import builtin_tools

PLANWEAVE = [sys.executable, "-m", "planweave.cli.main"]


def write_plan(path: Path, steps: int) -> None:
    """A YAML plan file of ``steps`` no-op steps in 20 layers (the engine benchmark's layered DAG)."""
    path.write_text(yaml.safe_dump(plan_document(layered(steps)), sort_keys=False))


def run_process(plan: Path, journal: str) -> float:
    """Wall time of ``planweave run PLAN --json --journal JOURNAL`` (exit 1 and the output if the run fails)."""
    started = time.perf_counter()
    done = subprocess.run([*PLANWEAVE, "run", str(plan), "--json", "--journal", journal],
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or json.loads(done.stdout).get("status") != "succeeded":
        sys.exit(f"planweave run {plan} --journal {journal} failed ({done.returncode}): {done.stdout[-500:]}"
                 f"{done.stderr[-500:]}")
    return elapsed


def parse_us_per_step(plan: Path, steps: int, repeats: int) -> tuple[float, float]:
    """Median µs per step of loading the plan file, and of validating the spec, in this process."""
    from planweave.planfile import load_plan_file

    loads, validations = [], []
    tools = builtin_tools()
    for _ in range(repeats):
        started = time.perf_counter()
        spec = load_plan_file(plan)
        loads.append(time.perf_counter() - started)
        started = time.perf_counter()
        validate_plan(spec, tools, {}, source=str(plan))
        validations.append(time.perf_counter() - started)
    return statistics.median(loads) / steps * 1e6, statistics.median(validations) / steps * 1e6


def main(
    steps: Annotated[int, typer.Option(min=1, help="no-op steps in the plan file")] = 10_000,
    repeats: Annotated[int, typer.Option(min=1, help="runs per journal")] = 3,
    keep: Annotated[Path | None, typer.Option(help="write the plan file here and keep it")] = None,
) -> None:
    """Whole-process figures for a big plan file (``planweave run`` wall time, parsing per step)."""
    with tempfile.TemporaryDirectory(prefix="planweave-big-") as tmp:
        plan = keep or Path(tmp) / "big.yaml"
        write_plan(plan, steps)
        one = Path(tmp) / "one.yaml"
        one.write_text(yaml.safe_dump({"name": "one", "steps": [{"id": "a", "tool": "noop"}]}))
        startup = [run_process(one, "null://") for _ in range(repeats)]
        rows = []
        for label, journal in (("null://", lambda i: "null://"),
                               ("SQLite", lambda i: f"sqlite:///{Path(tmp) / f'big-{i}.db'}")):
            walls = [run_process(plan, journal(i)) for i in range(repeats)]
            rows.append((label, statistics.median(walls), min(walls)))
        load_us, validate_us = parse_us_per_step(plan, steps, repeats)
    print(f"plan file: {steps:,} no-op steps (layered, 20 layers); {repeats} runs each; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"planweave run of a one-step plan (start-up): median {statistics.median(startup):.2f} s")
    print("journal     wall (median)   wall (best)   per step (median, start-up included)")
    for label, median, best in rows:
        print(f"{label:10s} {median:10.2f} s {best:11.2f} s {median / steps * 1e6:12.1f} us")
    print(f"load_plan_file (read + YAML + checks + PlanSpec): {load_us:.1f} us/step; "
          f"validate_plan: {validate_us:.1f} us/step")


if __name__ == "__main__":
    typer.run(main)
