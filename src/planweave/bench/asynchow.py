"""The AsyncHow check: run every AsyncHow plan on the virtual clock and compare its makespan with the gold answer.

AsyncHow (Lin et al., ICML 2024) labels 1,998 naturalistic plans with step durations, dependencies and the shortest
possible makespan with unlimited parallelism (``task_time``, a ``[lower, upper]`` interval). Each instance becomes
a plan of ``sleep`` steps (the upper duration bound, in seconds) and all of them run at once in one engine on a
:class:`~planweave.core.clock.VirtualClock`, so years of plan time take seconds. An engine that starts every step the
moment its last dependency finishes lands inside the gold interval every time.

The data set ships as pickles; they are read with an unpickler that resolves only ``datetime.timedelta``, so a
tampered file cannot run code.
"""

from __future__ import annotations

import datetime
import io
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave import open_engine
from planweave.bench.cli import parse_command_line
from planweave.bench.workloads import Workload, plan_document
from planweave.core.clock import VirtualClock, run_virtual
from planweave.core.errors import PlanweaveError
from planweave.core.plan.graph import parse_plan_document
from planweave.tools import builtin_tools

FILES = ("async_benchmark.pkl", "seq_benchmark.pkl", "para_benchmark.pkl")
"""The three files of the data set, in the order they are checked."""

COLUMNS = ("titles", "step_nums", "timedelta_dic", "step_deps", "task_time")
"""The per-instance columns the check reads."""

RELATIVE_TOLERANCE = 1e-9
"""How far (relative) a makespan may sit outside the gold interval and still count, for float rounding."""

_ALLOWED: Mapping[tuple[str, str], type] = {("datetime", "timedelta"): datetime.timedelta}


class DataSetError(PlanweaveError):
    """The AsyncHow data could not be read: a file is missing, malformed, or not the data set's format."""


class UnsafePickle(DataSetError):
    """Raised when a pickle references a class other than ``datetime.timedelta``; nothing from it is loaded."""


class _TimedeltaUnpickler(pickle.Unpickler):
    """An unpickler that resolves ``datetime.timedelta`` and refuses every other global."""

    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(io.BytesIO(data))
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise UnsafePickle(
                f"{self._source}: the pickle references {module}.{name}; only datetime.timedelta is allowed, "
                "so it was not loaded"
            )
        return allowed


def load_pickle(file: Path) -> Any:
    """Unpickle ``file`` allowing only ``datetime.timedelta``; raise :class:`UnsafePickle` or :class:`DataSetError`."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise DataSetError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        return _TimedeltaUnpickler(data, str(file)).load()
    except DataSetError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise DataSetError(f"{file} is not a readable pickle: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Instance:
    """One AsyncHow plan: step durations (seconds, upper bound), dependencies, and the gold makespan interval."""

    file: str
    index: int
    title: str
    durations: Mapping[str, float]
    edges: tuple[tuple[str, str], ...]
    gold: tuple[float, float]

    def workload(self) -> Workload:
        """The instance as a :class:`Workload` in topological order (step ``k`` becomes ``s<k>``)."""
        parents: dict[str, list[str]] = {sid: [] for sid in self.durations}
        for before, after in self.edges:
            parents[after].append(before)
        order: list[str] = []
        placed: set[str] = set()
        waiting = {sid: len(ps) for sid, ps in parents.items()}
        children: dict[str, list[str]] = {sid: [] for sid in self.durations}
        for before, after in self.edges:
            children[before].append(after)
        frontier = [sid for sid in self.durations if waiting[sid] == 0]
        while frontier:
            sid = frontier.pop()
            order.append(sid)
            placed.add(sid)
            for child in children[sid]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    frontier.append(child)
        if len(order) != len(self.durations):
            stuck = sorted(set(self.durations) - placed)
            raise DataSetError(f"{self.file} #{self.index} ({self.title!r}): dependency cycle among {stuck}")
        deps = {sid: tuple(sorted(parents[sid])) for sid in order}
        return Workload(self.title, deps, self.durations)


def _seconds(value: Any, where: str) -> float:
    if not isinstance(value, datetime.timedelta):
        raise DataSetError(f"{where}: expected a timedelta, got {type(value).__name__}")
    return value.total_seconds()


def _instance(file: str, columns: Mapping[str, Any], index: int) -> Instance:
    where = f"{file} #{index}"
    title = str(columns["titles"][index])
    count = int(columns["step_nums"][index])
    bounds = columns["timedelta_dic"][index]
    durations: dict[str, float] = {}
    for k in range(1, count + 1):
        pair = bounds.get(str(k)) if isinstance(bounds, Mapping) else None
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise DataSetError(f"{where} ({title!r}): step {k} has no [lower, upper] duration in timedelta_dic")
        durations[f"s{k}"] = _seconds(pair[1], f"{where} step {k}")
    edges: list[tuple[str, str]] = []
    for edge in sorted(columns["step_deps"][index]):
        before, after = (f"s{e}" for e in edge)
        for sid in (before, after):
            if sid not in durations:
                raise DataSetError(f"{where} ({title!r}): dependency {edge} names step {sid[1:]}, not in 1..{count}")
        edges.append((before, after))
    gold = columns["task_time"][index]
    return Instance(
        file, index, title, durations, tuple(edges), (_seconds(gold[0], where), _seconds(gold[1], where))
    )


def load_instances(directory: Path) -> list[Instance]:
    """Read every instance of the three AsyncHow files in ``directory`` (see :data:`FILES`)."""
    instances: list[Instance] = []
    for name in FILES:
        file = directory / name
        if not file.is_file():
            raise DataSetError(f"{file} not found: expected the AsyncHow files {', '.join(FILES)} in {directory}")
        columns = load_pickle(file)
        if not isinstance(columns, Mapping):
            raise DataSetError(f"{file}: expected a dict of columns, got {type(columns).__name__}")
        missing = [c for c in COLUMNS if c not in columns]
        if missing:
            raise DataSetError(f"{file}: missing column(s) {', '.join(missing)}")
        sizes = {len(columns[c]) for c in COLUMNS}
        if len(sizes) != 1:
            raise DataSetError(f"{file}: the columns {', '.join(COLUMNS)} differ in length ({sorted(sizes)})")
        instances.extend(_instance(name, columns, i) for i in range(sizes.pop()))
    return instances


async def _makespans(instances: Sequence[Instance]) -> list[tuple[float, float]]:
    """Run all instances at once in one engine on the running virtual loop; return (makespan, engine bound) each."""
    specs = [parse_plan_document(plan_document(i.workload()), f"{i.file} #{i.index}") for i in instances]
    async with open_engine("null://", clock=VirtualClock(), tools=builtin_tools(), concurrency=None) as engine:
        runs = [
            await engine.start(spec, source=f"{i.file} #{i.index}")
            for spec, i in zip(specs, instances, strict=True)
        ]
        out: list[tuple[float, float]] = []
        for run, instance in zip(runs, instances, strict=True):
            result = await run.wait()
            if not result.ok:
                raise DataSetError(f"{instance.file} #{instance.index} ({instance.title!r}): run {result.status}: "
                                   f"{result.error}")
            out.append((float(result.summary["makespan_s"]), run.plan.makespan_lower_bound))
    return out


def _inside(value: float, low: float, high: float) -> bool:
    slack_low = abs(low) * RELATIVE_TOLERANCE
    slack_high = abs(high) * RELATIVE_TOLERANCE
    return low - slack_low <= value <= high + slack_high


def run_asynchow(path: Path) -> dict[str, Any]:
    """Run every AsyncHow instance in ``path`` on the virtual clock; return the count inside the gold interval.

    The result has ``total``, ``exact`` (makespans inside ``task_time``), ``mismatches`` (file, index, title,
    makespan and gold interval of each miss), ``seconds`` (wall time, loading included), plus ``bound_agrees``
    (how often the plan's own critical-path bound equals the makespan) and per-file counts in ``files``.
    Must be called outside a running event loop (it runs its own virtual one).
    """
    started = time.perf_counter()
    instances = load_instances(Path(path))
    loaded = time.perf_counter()
    makespans = run_virtual(_makespans(instances))
    mismatches: list[dict[str, Any]] = []
    files: dict[str, dict[str, int]] = {name: {"total": 0, "exact": 0} for name in FILES}
    bound_agrees = 0
    for instance, (makespan, bound) in zip(instances, makespans, strict=True):
        counts = files[instance.file]
        counts["total"] += 1
        if abs(makespan - bound) <= abs(bound) * RELATIVE_TOLERANCE:
            bound_agrees += 1
        if _inside(makespan, *instance.gold):
            counts["exact"] += 1
        else:
            mismatches.append({
                "file": instance.file,
                "index": instance.index,
                "title": instance.title,
                "makespan": makespan,
                "gold": list(instance.gold),
            })
    finished = time.perf_counter()
    return {
        "total": len(instances),
        "exact": len(instances) - len(mismatches),
        "mismatches": mismatches,
        "seconds": round(finished - started, 3),
        "load_seconds": round(loaded - started, 3),
        "bound_agrees": bound_agrees,
        "files": files,
    }


def format_report(report: Mapping[str, Any]) -> str:
    """Render a :func:`run_asynchow` result as a few lines of text."""
    lines = [
        f"AsyncHow: {report['exact']}/{report['total']} makespans inside the gold interval "
        f"({report['seconds']:.2f} s, of which loading {report['load_seconds']:.2f} s)"
    ]
    for name, counts in report.get("files", {}).items():
        lines.append(f"  {name}: {counts['exact']}/{counts['total']}")
    for miss in report["mismatches"][:20]:
        lines.append(
            f"  MISMATCH {miss['file']} #{miss['index']} {miss['title']!r}: makespan {miss['makespan']:g} s, "
            f"gold [{miss['gold'][0]:g}, {miss['gold'][1]:g}] s"
        )
    if len(report["mismatches"]) > 20:
        lines.append(f"  ... and {len(report['mismatches']) - 20} more")
    return "\n".join(lines)


def _options(
    path: Annotated[Path, typer.Argument(help="the directory holding the three AsyncHow pickles", show_default=False)],
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> tuple[Path, bool]:
    """Run the AsyncHow makespan check."""
    return path, json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m planweave.bench.asynchow DIR [--json]``; exit 0 when every instance is exact."""
    import json
    import sys

    path, as_json = parse_command_line(_options, argv, "python -m planweave.bench.asynchow")
    try:
        report = run_asynchow(path)
    except DataSetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return 0 if report["exact"] == report["total"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
