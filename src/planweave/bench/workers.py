"""``planweave bench workers``: runs through worker processes on one PostgreSQL journal vs one engine process.

Three measurements, each in a fresh schema of the PostgreSQL server given (dropped afterwards):

- **baseline**: one engine in this process runs the N runs (each a small DAG of ``sleep`` steps) on the journal;
- **workers**: K ``planweave worker`` processes (already started and registered) run the same N runs, submitted to
  the queue in one transaction; the time is from the submission to the last run done in the queue, so it includes
  the queue's overhead (submit, claim, renew, the fence check in every batch) and the processes' own engines;
- **takeover**: two workers hold long runs; one is SIGKILLed, and the time until every run it held is claimed by the
  other is compared with the lease.

Runs/s are shown with their ratio to the baseline (same machine, same run); the takeover time beside the lease.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import psycopg
import typer
from psycopg import sql

from planweave.bench.cli import parse_command_line
from planweave.engine.runtime import Engine
from planweave.journal.leases import LeaseStore, QueuedRun
from planweave.journal.postgres import PostgresJournal

__all__ = ["WorkersResult", "main", "measure"]


@dataclass(frozen=True)
class Row:
    setup: str
    runs: int
    seconds: float
    runs_per_s: float
    ratio: float  # runs/s relative to the baseline


@dataclass(frozen=True)
class WorkersResult:
    rows: list[Row]
    lease_s: float
    takeover_s: float | None  # SIGKILL -> the last of the victim's runs claimed by the other worker
    taken_over: int


def _plan(rng: random.Random, steps: int, sleep_s: float) -> dict[str, Any]:
    """A fan-out/fan-in DAG: ``a``, then ``steps - 2`` in parallel, then ``z`` (``sleep`` steps of ~``sleep_s``)."""
    def step(sid: str, after: list[str]) -> dict[str, Any]:
        return {"id": sid, "tool": "sleep", "args": {"seconds": round(rng.uniform(0.5, 1.5) * sleep_s, 4)},
                "after": after}

    middle = [f"m{i}" for i in range(max(steps - 2, 1))]
    return {"steps": [step("a", []), *(step(m, ["a"]) for m in middle), step("z", middle)]}


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def _drop(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _count(url: str, schema: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema))).fetchone()
    return int(row[0]) if row else 0


async def _baseline(url: str, plans: list[dict[str, Any]]) -> float:
    journal = await PostgresJournal.open(url)
    try:
        async with Engine(journal) as engine:
            began = time.perf_counter()
            runs = [await engine.start(plan) for plan in plans]
            results = [await run.wait() for run in runs]
            seconds = time.perf_counter() - began
    finally:
        await journal.close()
    if not all(r.ok for r in results):
        raise RuntimeError("a baseline run failed")
    return seconds


async def _submit(url: str, plans: list[dict[str, Any]], prefix: str) -> None:
    store = await LeaseStore.open(url)
    try:
        await store.submit(*(QueuedRun(f"{prefix}{i:05d}", plan, "bench", {}) for i, plan in enumerate(plans)))
    finally:
        await store.close()


async def _prepare(url: str) -> None:
    journal = await PostgresJournal.open(url)
    await (await LeaseStore.open(url)).close()
    await journal.close()


def _workers(url: str, count: int, logs: Path, *args: str, first: int = 0) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    procs = []
    for i in range(count):
        log = (logs / f"w{i}-{uuid.uuid4().hex[:6]}.log").open("wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "planweave.cli.main", "worker", "--journal", url, "--name", f"w{first + i}", *args],
            stdout=subprocess.DEVNULL, stderr=log, env=env))
        log.close()
    return procs


def _wait(what: str, check: Any, timeout: float, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _through_workers(base: str, plans: list[dict[str, Any]], count: int, lease: float, max_runs: int,
                     logs: Path) -> float:
    schema = f"pw_bench_workers_{uuid.uuid4().hex[:8]}"
    url = _with_schema(base, schema)
    asyncio.run(_prepare(url))
    procs = _workers(url, count, logs, "--lease", str(lease), "--max-runs", str(max_runs))
    try:
        _wait("the workers registering", lambda: _count(
            base, schema, "SELECT count(*) FROM {s}.planweave_workers") == count, 30)
        began = time.perf_counter()
        asyncio.run(_submit(url, plans, "r"))
        _wait("every run done", lambda: _count(
            base, schema, "SELECT count(*) FROM {s}.planweave_leases WHERE state = 'done'") == len(plans), 600)
        seconds = time.perf_counter() - began
        failed = _count(base, schema, "SELECT count(*) FROM {s}.planweave_leases WHERE outcome <> 'succeeded'")
        if failed:
            raise RuntimeError(f"{failed} runs through the workers did not succeed (logs in {logs})")
        return seconds
    finally:
        _stop(procs)
        _drop(base, schema)


def _takeover(base: str, lease: float, logs: Path) -> tuple[float, int]:
    schema = f"pw_bench_takeover_{uuid.uuid4().hex[:8]}"
    url = _with_schema(base, schema)
    asyncio.run(_prepare(url))
    long_runs = [{"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 600}}]} for _ in range(8)]
    [victim] = _workers(url, 1, logs, "--lease", str(lease), "--max-runs", "4")
    others: list[subprocess.Popen[bytes]] = []
    try:
        asyncio.run(_submit(url, long_runs, "t"))
        _wait("the first worker holding 4 runs", lambda: _count(
            base, schema, "SELECT count(*) FROM {s}.planweave_leases WHERE holder = 'w0'") == 4, 60)
        others = _workers(url, 1, logs, "--lease", str(lease), "--max-runs", "8", first=1)
        _wait("the second worker holding the other 4", lambda: _count(
            base, schema, "SELECT count(*) FROM {s}.planweave_leases WHERE holder = 'w1'") == 4, 60)
        victim.kill()
        killed = time.time()
        victim.wait(10)
        _wait("the killed worker's runs taken over", lambda: _count(
            base, schema, "SELECT count(*) FROM {s}.planweave_leases WHERE holder = 'w1'") == 8, lease * 4 + 30)
        with psycopg.connect(base, autocommit=True) as conn:
            row = conn.execute(sql.SQL(
                "SELECT extract(epoch FROM max(claimed_at)), count(*) FROM {s}.planweave_lease_claims "
                "WHERE previous = 'w0'").format(s=sql.Identifier(schema))).fetchone()
        assert row is not None
        return float(row[0]) - killed, int(row[1])
    finally:
        _stop([victim, *others])
        _drop(base, schema)


def measure(base: str, runs: int, steps: int, sleep_s: float, workers: Sequence[int], lease: float,
            max_runs: int = 64) -> WorkersResult:
    """The baseline, each worker count, and the takeover (see the module docstring)."""
    rng = random.Random(7)
    plans = [_plan(rng, steps, sleep_s) for _ in range(runs)]
    logs = Path(tempfile.mkdtemp(prefix="planweave-bench-workers-"))
    schema = f"pw_bench_base_{uuid.uuid4().hex[:8]}"
    try:
        base_s = asyncio.run(_baseline(_with_schema(base, schema), plans))
    finally:
        _drop(base, schema)
    base_rate = runs / base_s
    rows = [Row("one engine, this process", runs, base_s, base_rate, 1.0)]
    for count in workers:
        seconds = _through_workers(base, plans, count, lease, max_runs, logs)
        rows.append(Row(f"{count} worker process{'es' if count > 1 else ''}", runs, seconds, runs / seconds,
                        (runs / seconds) / base_rate))
    takeover_s, taken = _takeover(base, lease, logs)
    return WorkersResult(rows, lease, takeover_s, taken)


def table(result: WorkersResult) -> str:
    lines = [f"{'setup':<28} {'runs':>6} {'seconds':>8} {'runs/s':>8} {'vs one engine':>14}"]
    for r in result.rows:
        lines.append(f"{r.setup:<28} {r.runs:>6} {r.seconds:>8.2f} {r.runs_per_s:>8.1f} {r.ratio:>13.2f}x")
    if result.takeover_s is not None:
        lines.append(f"takeover: {result.taken_over} runs of a SIGKILLed worker claimed by another "
                     f"{result.takeover_s:.2f}s after the kill (lease {result.lease_s:g}s)")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Options:
    pg: str
    runs: int
    steps: int
    sleep: float
    workers: tuple[int, ...]
    lease: float
    max_runs: int
    json: bool


def _options(
    pg: Annotated[str | None, typer.Option(
        help="PostgreSQL server (fresh schemas are created and dropped; default $PLANWEAVE_TEST_PG or "
             "postgresql://127.0.0.1:5432/test)", show_default=False)] = None,
    runs: Annotated[int, typer.Option(min=1, help="runs to submit")] = 200,
    steps: Annotated[int, typer.Option(min=3, help="steps per run (a fan-out/fan-in DAG)")] = 4,
    sleep: Annotated[float, typer.Option(min=0.0, help="seconds per step, about")] = 0.02,
    workers: Annotated[str, typer.Option(help="worker counts to measure, comma-separated")] = "1,3",
    lease: Annotated[float, typer.Option(help="the workers' lease in seconds (above 0)")] = 2.0,
    max_runs: Annotated[int, typer.Option(min=1, help="runs each worker holds at once")] = 64,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> _Options:
    """Runs through worker processes on one PostgreSQL journal vs one engine process."""
    try:
        counts = tuple(int(c) for c in workers.split(",") if c.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise typer.BadParameter(f"expected a list of counts of at least 1 like 1,3, got {workers!r}",
                                 param_hint="--workers")
    if not lease > 0:
        raise typer.BadParameter(f"{lease:g} is not above 0", param_hint="--lease")
    url = pg if pg is not None else os.environ.get("PLANWEAVE_TEST_PG", "postgresql://127.0.0.1:5432/test")
    return _Options(url, runs, steps, sleep, counts, lease, max_runs, json_output)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (or JSON); a bad option exits 2 naming it (SystemExit)."""
    args = parse_command_line(_options, argv, "planweave bench workers")
    counts = list(args.workers)
    result = measure(args.pg, args.runs, args.steps, args.sleep, counts, args.lease, args.max_runs)
    print(json.dumps(asdict(result), indent=2) if args.json else table(result))
    return 0
