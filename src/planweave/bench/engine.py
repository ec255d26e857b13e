"""The engine benchmark: planweave's overhead, makespan and journal throughput beside its peers, in one process.

Three sections, all printed as one table (``--json``: the same data as a JSON object):

- **overhead**: microseconds per step on no-op DAGs (a fan-out/fan-in and a random layered DAG, 1,000 and 10,000
  steps), best of ``--repeats``; for planweave from ``engine.start(spec)`` (validation included) until
  ``run.wait()`` returns, for the peers from submission to completion (graph building is not timed).
- **latency**: makespan on the real clock of DAGs whose steps sleep (a random DAG around 50 ms per step, and an
  uneven one where a 500 ms step sits beside 10 ms steps nothing waits for), against the critical path.
- **journal**: events per second the SQLite and PostgreSQL journals store
  (:func:`planweave.journal.throughput.measure_throughput`), and the process's peak RSS after each system.

Systems: planweave on the ``null://``, ``memory://``, SQLite and PostgreSQL journals, the hand-written asyncio
floor, LangGraph and Ray (:mod:`planweave.bench.peers`). Every system runs the same seeded DAGs
(:mod:`planweave.bench.workloads`). Run ``python -m planweave.bench.engine --help`` (or ``planweave bench engine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import json
import os
import platform
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import typer

from planweave import open_engine
from planweave.bench.cli import parse_command_line
from planweave.bench.peers import (
    FloorSystem,
    JournaledFloorSystem,
    LangGraphSystem,
    RaySystem,
    System,
    SystemUnavailable,
)
from planweave.bench.workloads import Workload, critical_path, fan_out, latency_random, layered, plan_document, uneven
from planweave.core.errors import PlanweaveError
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.engine import COMPILED, Engine, Run
from planweave.tools import builtin_tools

DEFAULT_PG = os.environ.get("PLANWEAVE_TEST_PG", "postgresql://127.0.0.1:5432/test")

COLUMNS: tuple[tuple[str, str], ...] = (
    ("pw-null", "planweave null://"),
    ("pw-memory", "planweave memory://"),
    ("pw-sqlite", "planweave SQLite"),
    ("pw-postgres", "planweave PostgreSQL"),
    ("floor", "asyncio floor"),
    ("floor-fold", "journaled floor"),
    ("langgraph", "LangGraph"),
    ("ray", "Ray (local)"),
)
"""The systems in table order: key and column heading."""

RUN_ORDER = ("floor", "floor-fold", "pw-null", "pw-memory", "pw-sqlite", "pw-postgres", "langgraph", "ray")
"""The order systems are measured in: the peers that start threads and processes (LangGraph, Ray) go last."""

PEERS = frozenset({"langgraph", "ray"})
SECTIONS = frozenset({"overhead", "latency", "journal"})

TARGET_FLOOR_RATIO = 2.0
TARGET_SQLITE_US = 50.0
TARGET_MAKESPAN_RATIO = 1.02


class BenchFailure(PlanweaveError):
    """A system under test did not complete a workload (its run failed or was cancelled)."""


@dataclass(frozen=True)
class Settings:
    """What to measure and how often; built from the command line by :func:`parse_args`."""

    sizes: tuple[int, ...] = (1_000, 10_000)
    repeats: int = 3
    latency_repeats: int = 2
    budget: float = 30.0
    systems: tuple[str, ...] = tuple(key for key, _ in COLUMNS)
    sections: frozenset[str] = SECTIONS
    pg: str = DEFAULT_PG
    random_steps: int = 200
    uneven_layers: int = 20
    throughput_events: int = 20_000


@dataclass
class Measurement:
    """The timed runs of one system on one workload: ``runs`` in seconds, or a ``note`` saying why there are none.

    ``durations`` are the actual step durations of the fastest run (sleeping workloads only).
    """

    runs: list[float] = field(default_factory=list)
    note: str = ""
    durations: Mapping[str, float] = field(default_factory=dict)

    @property
    def best(self) -> float | None:
        return min(self.runs) if self.runs else None


# -- planweave as a system under test --------------------------------------------------------------------------------


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query) + list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


class PlanweaveSystem:
    """planweave on one journal: one engine (unlimited concurrency, the built-in tools) for every workload.

    ``prepare`` parses the plan document and validates it against the engine's tools and capacities (and notes
    whether its steps sleep); ``run`` times ``engine.start`` of the validated plan through ``run.wait()``. The
    validation is timed apart (``validation_us``, us per step), as LangGraph's graph build and compile are: each
    system's check of its graph is out of the timed run and reported beside it (``engine.start`` does not check a
    plan validated against the same tools and capacities again).
    """

    def __init__(self, key: str, label: str, url: Callable[[], str], cleanup: Callable[[], Any] | None = None) -> None:
        self.key = key
        self.label = label
        self._url = url
        self._cleanup = cleanup
        self._stack = contextlib.AsyncExitStack()
        self._engine: Engine | None = None
        self._tools = builtin_tools()
        self.url = ""
        self.validation_us: dict[str, float] = {}

    async def open(self) -> None:
        self.url = self._url()
        try:
            self._engine = await self._stack.enter_async_context(open_engine(
                self.url, tools=self._tools, concurrency=None))  # unlimited, like the peers it is compared with
        except PlanweaveError as exc:
            await self.close()
            raise SystemUnavailable(f"cannot open the journal: {exc}") from None

    async def prepare(self, workload: Workload) -> tuple[Plan, bool]:
        assert self._engine is not None, "open() first"
        spec = parse_plan_document(plan_document(workload), workload.name)
        started = time.perf_counter()
        plan = validate_plan(spec, self._tools, self._engine.capacities, source=workload.name)
        self.validation_us[workload.name] = (time.perf_counter() - started) / max(len(plan), 1) * 1e6
        return plan, bool(workload.durations)

    async def run(self, prepared: tuple[Plan, bool]) -> object:
        assert self._engine is not None, "open() first"
        plan = prepared[0]
        run = await self._engine.start(plan, source=plan.spec.name or "bench")
        try:
            result = await run.wait()
        except asyncio.CancelledError:
            run.cancel("the benchmark's time budget ran out")
            raise
        if not result.ok:
            raise BenchFailure(f"{self.label}: run {result.run_id} {result.status}: {result.error}")
        return run

    async def step_durations(self, prepared: tuple[Plan, bool], trace: object) -> Mapping[str, float]:
        """Each step's time from its ``step_started`` to its ``step_succeeded`` event (sleeping plans only)."""
        if not prepared[1] or not isinstance(trace, Run):
            return {}
        out: dict[str, float] = {}
        for sid, record in trace.state.records.items():
            if record.started_at is not None and record.finished_at is not None:
                out[sid] = record.finished_at - record.started_at
        return out

    async def close(self) -> None:
        try:
            await self._stack.aclose()
        finally:
            self._engine = None
            if self._cleanup is not None:
                done = self._cleanup()
                if asyncio.iscoroutine(done):
                    await done


async def _postgres_reachable(url: str) -> str | None:
    """Return None if PostgreSQL answers at ``url`` within 3 s, else the reason it does not."""
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=3)
    except (psycopg.Error, OSError) as exc:
        return f"PostgreSQL unreachable at {url}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
    await conn.close()
    return None


async def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with contextlib.suppress(psycopg.Error, OSError):
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=3, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- measuring ---------------------------------------------------------------------------------------------------


async def _measure(system: System[Any], prepared: Any, repeats: int, budget: float) -> Measurement:
    """Run ``prepared`` up to ``repeats`` times while the time spent stays within ``budget`` seconds."""
    out = Measurement()
    spent = 0.0
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        try:
            async with asyncio.timeout(max(budget - spent, 0.001)):
                trace = await system.run(prepared)
        except TimeoutError:
            if not out.runs:
                out.note = f"> {budget:g} s budget"
            break
        except Exception as exc:  # a failing peer is a result to report, not a reason to stop the benchmark
            out.note = f"failed: {type(exc).__name__}: {exc}"[:200]
            break
        elapsed = time.perf_counter() - started
        if not out.runs or elapsed < min(out.runs):
            out.durations = await system.step_durations(prepared, trace)
        out.runs.append(elapsed)
        spent += elapsed
        if spent + elapsed > budget:
            break
    return out


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / (1024 * 1024)


def overhead_workloads(sizes: Sequence[int]) -> list[Workload]:
    """The no-op workloads: a fan-out and a layered DAG per size."""
    return [fan_out(n) for n in sizes] + [layered(n) for n in sizes]


def latency_workloads(settings: Settings) -> list[Workload]:
    """The latency-bound workloads: the random DAG and the uneven one."""
    return [latency_random(settings.random_steps), uneven(settings.uneven_layers)]


def _systems(settings: Settings, tmp: Path) -> dict[str, System[Any]]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    pg_url = _with_query(settings.pg, schema=schema)
    built: dict[str, System[Any]] = {
        "pw-null": PlanweaveSystem("pw-null", "planweave null://", lambda: "null://"),
        "pw-memory": PlanweaveSystem("pw-memory", "planweave memory://", lambda: "memory://"),
        "pw-sqlite": PlanweaveSystem("pw-sqlite", "planweave SQLite", lambda: f"sqlite:///{tmp / 'bench.db'}"),
        "pw-postgres": PlanweaveSystem(
            "pw-postgres", "planweave PostgreSQL", lambda: pg_url, lambda: _drop_schema(settings.pg, schema)
        ),
        "floor": FloorSystem(),
        "floor-fold": JournaledFloorSystem(),
        "langgraph": LangGraphSystem(),
        "ray": RaySystem(),
    }
    return {key: built[key] for key in RUN_ORDER if key in settings.systems}


def _throughput_url(key: str, system: System[Any], tmp: Path) -> str | None:
    if key == "pw-sqlite":
        return f"sqlite:///{tmp / 'throughput.db'}"
    if key == "pw-postgres" and isinstance(system, PlanweaveSystem):
        return system.url
    return None


async def _journal_throughput(url: str, settings: Settings) -> dict[str, Any]:
    try:
        from planweave.journal.throughput import measure_throughput
    except ImportError as exc:
        return {"note": f"planweave.journal.throughput is not available: {exc}"}
    best: dict[str, Any] = {}
    for _ in range(settings.repeats):
        gc.collect()
        try:
            result = await measure_throughput(url, settings.throughput_events)
        except Exception as exc:  # report, do not abort the benchmark
            return {"note": f"failed: {type(exc).__name__}: {exc}"[:200]}
        if not best or result["events_per_s"] > best["events_per_s"]:
            best = dict(result)
    return best


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _predicted_too_slow(
    workload: Workload, earlier: dict[str, Measurement], sizes: dict[str, int], budget: float
) -> str | None:
    """If a smaller workload of the same shape already took so long that this one cannot fit, say so."""
    shape = workload.name.split(" ")[0]
    for name, measurement in earlier.items():
        if name.split(" ")[0] == shape and measurement.best is not None and sizes[name] < len(workload):
            predicted = measurement.best * len(workload) / sizes[name]
            if predicted > budget:
                return f"> {budget:g} s budget (predicted {predicted:.0f} s)"
        if name.split(" ")[0] == shape and measurement.note.startswith(">"):
            return measurement.note
    return None


async def run_benchmark(settings: Settings, progress: Callable[[str], None] = _progress) -> dict[str, Any]:
    """Measure every selected system on every workload in this process; return the results as a JSON-ready dict."""
    overhead = overhead_workloads(settings.sizes) if "overhead" in settings.sections else []
    latency = latency_workloads(settings) if "latency" in settings.sections else []
    sizes = {w.name: len(w) for w in overhead}
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "planweave": _version("pw-null"),
        "engine": "engine compiled with mypyc" if COMPILED else "pure Python",
        "settings": {
            "sizes": list(settings.sizes),
            "repeats": settings.repeats,
            "latency_repeats": settings.latency_repeats,
            "budget_s": settings.budget,
            "sections": sorted(settings.sections),
        },
        "systems": {},
        "overhead": {w.name: {"steps": len(w), "results": {}} for w in overhead},
        "latency": {
            w.name: {"steps": len(w), "depth": w.depth, "critical_path_s": w.critical_path, "results": {}}
            for w in latency
        },
        "journal_throughput": {},
    }
    with tempfile.TemporaryDirectory(prefix="planweave-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for key, system in _systems(settings, tmp).items():
            info: dict[str, Any] = {"label": system.label, "status": "measured"}
            results["systems"][key] = info
            if key == "pw-postgres":
                reason = await _postgres_reachable(settings.pg)
                if reason is not None:
                    info["status"] = f"skipped: {reason}"
                    progress(f"{system.label}: {info['status']}")
                    continue
            progress(f"{system.label}: opening")
            try:
                await system.open()
            except SystemUnavailable as exc:
                info["status"] = f"skipped: {exc}"
                progress(f"{system.label}: {info['status']}")
                continue
            try:
                await _measure_system(key, system, overhead, latency, sizes, settings, results, tmp, progress)
            finally:
                await system.close()
                info["peak_rss_mb"] = round(_peak_rss_mb(), 1)
            if isinstance(system, LangGraphSystem):
                info["compile_s"] = {name: round(s, 3) for name, s in system.compile_seconds.items()}
            if isinstance(system, PlanweaveSystem):
                info["validation_us_per_step"] = {name: round(us, 2) for name, us in system.validation_us.items()}
            info["version"] = _version(key)
    results["targets"] = evaluate_targets(results)
    return results


async def _measure_system(
    key: str,
    system: System[Any],
    overhead: list[Workload],
    latency: list[Workload],
    sizes: dict[str, int],
    settings: Settings,
    results: dict[str, Any],
    tmp: Path,
    progress: Callable[[str], None],
) -> None:
    # Warm up (imports, caches, worker processes) on small graphs of both kinds before anything is timed.
    warmups = [fan_out(100)] + ([latency_random(20, median=0.005)] if latency else [])
    for warm in warmups:
        await _measure(system, await system.prepare(warm), 1, settings.budget)
    done: dict[str, Measurement] = {}
    for workload in overhead:
        slow = _predicted_too_slow(workload, done, sizes, settings.budget)
        measurement = Measurement(note=slow) if slow else await _measure(
            system, await system.prepare(workload), settings.repeats, settings.budget
        )
        done[workload.name] = measurement
        entry: dict[str, Any] = {"runs_s": [round(r, 6) for r in measurement.runs], "note": measurement.note}
        if measurement.best is not None:
            entry["us_per_step"] = round(measurement.best / len(workload) * 1e6, 2)
        results["overhead"][workload.name]["results"][key] = entry
        progress(f"{system.label}: {workload.name}: {_overhead_cell(entry)} us/step")
    for workload in latency:
        measurement = await _measure(system, await system.prepare(workload), settings.latency_repeats, settings.budget)
        entry = {"runs_s": [round(r, 4) for r in measurement.runs], "note": measurement.note}
        if measurement.best is not None:
            entry["makespan_s"] = round(measurement.best, 4)
            entry["ratio"] = round(measurement.best / workload.critical_path, 4)
            if len(measurement.durations) == len(workload):
                actual = critical_path(workload.deps, measurement.durations)
                entry["actual_critical_path_s"] = round(actual, 4)
                entry["actual_ratio"] = round(measurement.best / actual, 4)
        results["latency"][workload.name]["results"][key] = entry
        progress(f"{system.label}: {workload.name}: makespan {entry.get('makespan_s', entry['note'])}")
    url = _throughput_url(key, system, tmp)
    if "journal" in settings.sections and url is not None:
        results["journal_throughput"][key] = await _journal_throughput(url, settings)
        progress(f"{system.label}: journal throughput {results['journal_throughput'][key]}")


def _version(key: str) -> str:
    dist = {"langgraph": "langgraph", "ray": "ray"}.get(key, "planweave" if key.startswith("pw-") else "")
    if not dist:
        return platform.python_version()
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _machine() -> dict[str, Any]:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


# -- targets and the table ---------------------------------------------------------------------------------------


def _value(results: dict[str, Any], section: str, workload: str, key: str, field_name: str) -> float | None:
    entry = results[section].get(workload, {}).get("results", {}).get(key, {})
    value = entry.get(field_name)
    return float(value) if value is not None else None


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Compare the results with the targets (not assertions): journal off <= 2x the floor, SQLite <= 50 us per step,
    makespan within 2 % of the critical path. One entry per row of the table a target applies to."""
    targets: list[dict[str, Any]] = []
    for name in results["overhead"]:
        null = _value(results, "overhead", name, "pw-null", "us_per_step")
        floor = _value(results, "overhead", name, "floor", "us_per_step")
        if null is not None and floor is not None and floor > 0:
            ratio = null / floor
            targets.append({"row": name, "target": f"null <= {TARGET_FLOOR_RATIO:g}x floor",
                            "value": f"{ratio:.2f}x", "met": ratio <= TARGET_FLOOR_RATIO})
        sqlite = _value(results, "overhead", name, "pw-sqlite", "us_per_step")
        if sqlite is not None:
            targets.append({"row": name, "target": f"SQLite <= {TARGET_SQLITE_US:g} us",
                            "value": f"{sqlite:.1f} us", "met": sqlite <= TARGET_SQLITE_US})
    for name in results["latency"]:
        ratios = {}
        for key in ("pw-null", "pw-memory", "pw-sqlite", "pw-postgres", "floor"):
            actual = _value(results, "latency", name, key, "actual_ratio")
            value = actual if actual is not None else _value(results, "latency", name, key, "ratio")
            if value is not None:
                ratios[key] = value
        floor_ratio = ratios.pop("floor", None)
        if ratios:
            worst_key = max(ratios, key=lambda k: ratios[k])
            floor_text = f"; floor {floor_ratio:.3f}x" if floor_ratio is not None else ""
            targets.append({"row": name, "target": f"planweave <= {TARGET_MAKESPAN_RATIO:g}x",
                            "value": f"{ratios[worst_key]:.3f}x (worst, {worst_key}{floor_text})",
                            "met": ratios[worst_key] <= TARGET_MAKESPAN_RATIO})
    return targets


def _overhead_cell(entry: dict[str, Any]) -> str:
    us = entry.get("us_per_step")
    if us is None:
        return str(entry.get("note") or "-")
    return f"{us:,.1f}" if us < 1000 else f"{us:,.0f}"


def _status_cell(status: str) -> str:
    return "skipped" if status.startswith("skipped") else "-"


def render_table(results: dict[str, Any]) -> str:  # noqa: C901 (a table: one branch per row kind)
    """Render the results as one Markdown table (aligned, so it reads in a terminal too), then its notes."""
    systems: dict[str, Any] = results["systems"]
    keys = [key for key, _ in COLUMNS if key in systems]
    headings = [label for key, label in COLUMNS if key in systems]
    targets_by_row: dict[str, list[str]] = {}
    for t in results.get("targets", []):
        mark = "ok" if t["met"] else "MISSED"
        targets_by_row.setdefault(t["row"], []).append(f"{t['target']}: {t['value']} {mark}")

    def missing(key: str, entry: dict[str, Any] | None) -> str:
        if entry is not None and entry.get("note"):
            return str(entry["note"])
        return _status_cell(systems[key]["status"])

    rows: list[list[str]] = []
    for name, data in results["overhead"].items():
        cells = []
        for key in keys:
            entry = data["results"].get(key)
            cells.append(_overhead_cell(entry) if entry and "us_per_step" in entry else missing(key, entry))
        rows.append([f"{name}: us/step", "; ".join(targets_by_row.get(name, [])), *cells])
    for name, data in results["latency"].items():
        makespans, ratios, actual = [], [], []
        for key in keys:
            entry = data["results"].get(key)
            if entry and "makespan_s" in entry:
                makespans.append(f"{entry['makespan_s']:.3f} s")
                ratios.append(f"{entry['ratio']:.3f}x")
                actual.append(f"{entry['actual_ratio']:.3f}x" if "actual_ratio" in entry else "-")
            else:
                for column in (makespans, ratios, actual):
                    column.append(missing(key, entry))
        rows.append([f"{name}: makespan", f"{data['steps']} steps, depth {data['depth']}", *makespans])
        rows.append([f"{name}: / planned critical path", f"critical path {data['critical_path_s']:.3f} s", *ratios])
        rows.append([f"{name}: / actual critical path", "; ".join(targets_by_row.get(name, [])), *actual])
    if results["journal_throughput"]:
        cells = []
        for key in keys:
            entry = results["journal_throughput"].get(key)
            if entry and "events_per_s" in entry:
                cells.append(f"{entry['events_per_s']:,.0f}")
            else:
                cells.append(str(entry["note"])[:40] if entry and entry.get("note") else "-")
        rows.append(["journal throughput: events/s", "measure_throughput", *cells])
    rows.append(["peak RSS after column: MB", "whole process, cumulative"]
                + [f"{systems[k]['peak_rss_mb']:,.0f}" if "peak_rss_mb" in systems[k] else "-" for k in keys])

    header = ["measure", "target / note", *headings]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    out = [line(header), "|" + "|".join(("-" * (w + 2) if i < 2 else "-" * (w + 1) + ":") for i, w in
                                        enumerate(widths)) + "|"]
    out += [line(row) for row in rows]
    machine = results["machine"]
    notes = [
        "",
        f"planweave {results['planweave']} ({results.get('engine', 'pure Python')}), {results['date']} on "
        f"{machine['cpus']} CPUs ({machine['cpu']}), "
        f"Python {machine['python']}, "
        f"{machine['platform']}; overhead best of {results['settings']['repeats']}, "
        f"makespan best of {results['settings']['latency_repeats']}, budget {results['settings']['budget_s']:g} s "
        "per system and workload.",
    ]
    for key in keys:
        info = systems[key]
        extra = []
        if info.get("version") and key in PEERS:
            extra.append(f"version {info['version']}")
        if info.get("validation_us_per_step"):
            extra.append("plan validation, not timed, us per step: " + ", ".join(
                f"{n} {us:g}" for n, us in info["validation_us_per_step"].items()))
        if info.get("compile_s"):
            extra.append("graph build + compile, not timed: " + ", ".join(
                f"{n} {s:g} s" for n, s in info["compile_s"].items()))
        if info["status"] != "measured":
            extra.append(info["status"])
        if extra:
            notes.append(f"- {info['label']}: " + "; ".join(extra))
    return "\n".join(out + notes)


# -- command line ------------------------------------------------------------------------------------------------


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated step counts like 1000,10000, got {text!r}",
                                 param_hint="--sizes") from None
    if not values or any(v < 20 for v in values):
        raise typer.BadParameter(f"step counts must be at least 20 (the layered DAG has 20 layers): {text!r}",
                                 param_hint="--sizes")
    return values


def _names(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise typer.BadParameter(f"unknown {', '.join(unknown) or 'empty list'}: choose from {', '.join(allowed)}",
                                 param_hint=flag)
    return names


def _settings(
    sizes: Annotated[str | None, typer.Option(help="step counts of the no-op DAGs (default 1000,10000)")] = None,
    repeats: Annotated[int | None, typer.Option(min=1, help="runs per overhead measurement, best kept (default 3)")]
    = None,
    latency_repeats: Annotated[int | None, typer.Option(min=1, help="runs per makespan measurement (default 2)")]
    = None,
    budget: Annotated[float | None, typer.Option(help="seconds allowed per system and workload (default 30)")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="a smoke run: 1,000 steps, one repeat, smaller latency DAGs, 10 s budget")] = False,
    skip_peers: Annotated[bool, typer.Option("--skip-peers", help="do not measure LangGraph and Ray")] = False,
    systems: Annotated[str | None, typer.Option(help="comma-separated systems to measure (default: all)")] = None,
    sections: Annotated[str | None, typer.Option(
        help="comma-separated sections: overhead, latency, journal (default: all)")] = None,
    pg: Annotated[str, typer.Option(help="PostgreSQL server for the PostgreSQL journal (a fresh schema is created "
                                         "and dropped); skipped if unreachable")] = DEFAULT_PG,
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON instead of the table")]
    = False,
) -> tuple[Settings, bool]:
    """Measure planweave's per-step overhead, makespan and journal throughput beside an asyncio floor, LangGraph and
    Ray, in one process, and print one table."""
    chosen = _names(systems, [k for k, _ in COLUMNS], "--systems") if systems else tuple(k for k, _ in COLUMNS)
    if skip_peers:
        chosen = tuple(s for s in chosen if s not in PEERS)
    settings = Settings(
        sizes=_positive_ints(sizes) if sizes else ((1_000,) if quick else (1_000, 10_000)),
        repeats=repeats if repeats is not None else (1 if quick else 3),
        latency_repeats=latency_repeats if latency_repeats is not None else (1 if quick else 2),
        budget=budget if budget is not None else (10.0 if quick else 30.0),
        systems=chosen,
        sections=frozenset(_names(sections, sorted(SECTIONS), "--sections")) if sections else SECTIONS,
        pg=pg,
        random_steps=50 if quick else 200,
        uneven_layers=5 if quick else 20,
        throughput_events=2_000 if quick else 20_000,
    )
    return settings, json_output


def parse_args(argv: Sequence[str] | None) -> tuple[Settings, bool]:
    """Read the command line into :class:`Settings` plus whether to print JSON (SystemExit 2 on a bad option)."""
    return parse_command_line(_settings, argv, "planweave bench engine")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine benchmark with command-line arguments ``argv``; print the table (or JSON); return 0."""
    settings, as_json = parse_args(argv)
    results = asyncio.run(run_benchmark(settings))
    print(json.dumps(results, indent=2) if as_json else render_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
