"""``planweave bench scale``: many runs on one machine.

Two measurements, each beside a baseline taken in the same process:

* **runs** (default): N concurrent small runs (a chain of S steps, each sleeping) in one engine, against plain asyncio
  tasks doing the same sleeps. Reported: wall time, runs/s, peak RSS (and its growth per run), and the p50/p99
  *ready-to-start latency*: from the moment a step could start (its predecessor's sleep was due to end, or the run
  was asked to start) to the moment its tool begins. The baseline's is the loop's own timer lateness.
* **listing** (``--listing``): fill a journal with N ended and running runs (at the engine's pace of summaries:
  each run's state is tracked exactly as the engine does it) and time ``Journal.list_runs(limit=50)`` against
  folding every event (what ``planweave runs`` did before run summaries), and ``planweave runs --limit 50`` end
  to end as a process.

Speed is printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line

__all__ = ["ListingResult", "ScaleResult", "fill_journal", "main", "measure_listing", "measure_runs"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    """This process's resident set size now, in bytes (Linux ``/proc``; else the peak so far)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _PeakRSS:
    """Samples the RSS every ``interval`` seconds on a thread-free asyncio task while a phase runs."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.start = _rss()
        self.peak = self.start
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _PeakRSS:
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.peak = max(self.peak, _rss())

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _rss())
            await asyncio.sleep(self.interval)


@dataclass
class Phase:
    """One side of the runs measurement."""

    name: str
    wall_s: float = 0.0
    runs_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    rss_growth_mb: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    start_s: float = 0.0  # time to submit every run
    # The same latency for the steps that became ready after the last run was submitted: the pace once the burst
    # of starting runs (which saturates the loop) is over (0: no such step).
    steady_p50_ms: float = 0.0
    steady_p99_ms: float = 0.0
    steady_steps: int = 0


@dataclass
class ScaleResult:
    """The runs measurement: settings, the asyncio baseline and the engine."""

    runs: int
    steps: int
    sleep_s: float
    journal: str
    baseline: Phase = field(default_factory=lambda: Phase("asyncio tasks"))
    engine: Phase = field(default_factory=lambda: Phase("planweave"))
    status: dict[str, int] = field(default_factory=dict)


class _Timings:
    """Where each step's tool began and when its sleep was due to end, per run and step index."""

    def __init__(self, runs: int, steps: int) -> None:
        self.started = [[0.0] * steps for _ in range(runs)]
        self.due = [[0.0] * steps for _ in range(runs)]
        self.asked = [0.0] * runs  # when the run was asked to start
        self.burst_end = 0.0  # when the last run had been asked to start

    def latencies(self, *, after: float | None = None) -> list[float]:
        """Every step's ready-to-start latency; ``after``: only of the steps that became ready after that time."""
        out: list[float] = []
        for run, starts in enumerate(self.started):
            ready = self.asked[run]
            for k, start in enumerate(starts):
                if after is None or ready > after:
                    out.append(start - ready)
                ready = self.due[run][k]
        return out


def _fill_phase(phase: Phase, timings: _Timings, wall: float, started: float, rss: _PeakRSS, runs: int) -> None:
    lat = sorted(timings.latencies())
    phase.wall_s = wall
    phase.runs_per_s = runs / wall if wall > 0 else 0.0
    phase.peak_rss_mb = rss.peak / 2**20
    phase.rss_growth_mb = (rss.peak - rss.start) / 2**20
    phase.p50_ms = lat[len(lat) // 2] * 1000
    phase.p99_ms = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    phase.mean_ms = statistics.fmean(lat) * 1000
    phase.start_s = started
    steady = sorted(timings.latencies(after=timings.burst_end))
    if steady:
        phase.steady_p50_ms = steady[len(steady) // 2] * 1000
        phase.steady_p99_ms = steady[min(len(steady) - 1, int(len(steady) * 0.99))] * 1000
        phase.steady_steps = len(steady)


async def _baseline(runs: int, steps: int, sleep_s: float) -> tuple[_Timings, float, float, _PeakRSS]:
    timings = _Timings(runs, steps)
    loop = asyncio.get_running_loop()

    async def one(run: int) -> None:
        for k in range(steps):
            now = loop.time()
            timings.started[run][k] = now
            timings.due[run][k] = now + sleep_s
            await asyncio.sleep(sleep_s)

    async with _PeakRSS() as rss:
        t0 = loop.time()
        tasks = []
        for run in range(runs):
            timings.asked[run] = loop.time()
            tasks.append(loop.create_task(one(run)))
        timings.burst_end = loop.time()
        submitted = timings.burst_end - t0
        await asyncio.gather(*tasks)
        wall = loop.time() - t0
    return timings, wall, submitted, rss


async def _engine(runs: int, steps: int, sleep_s: float, url: str) -> tuple[_Timings, float, float, _PeakRSS,
                                                                           dict[str, int]]:
    from planweave import Engine, Toolbox
    from planweave.core.plan.graph import parse_plan_document
    from planweave.journal import open_journal

    timings = _Timings(runs, steps)
    loop = asyncio.get_running_loop()

    async def nap(run: int, k: int, seconds: float) -> None:
        """Sleep ``seconds``, recording when this step began and when its sleep is due to end."""
        now = loop.time()
        timings.started[run][k] = now
        timings.due[run][k] = now + seconds
        await asyncio.sleep(seconds)

    tools = Toolbox()
    tools.add(nap, idempotent=True)
    docs = []
    for run in range(runs):
        doc = {"steps": [{"id": f"s{k}", "tool": "nap", "args": {"run": run, "k": k, "seconds": sleep_s},
                          **({"after": [f"s{k - 1}"]} if k else {})} for k in range(steps)]}
        docs.append(parse_plan_document(doc, "bench scale"))
    status: dict[str, int] = {}
    async with (open_journal(url) as journal, Engine(journal, tools=tools, concurrency=None) as engine,
                _PeakRSS() as rss):
        t0 = loop.time()
        started = []
        for run in range(runs):
            timings.asked[run] = loop.time()
            # No run id given: a given one is checked against the journal first, a durable read (a commit) per run.
            started.append(await engine.start(docs[run]))
        timings.burst_end = loop.time()
        submitted = timings.burst_end - t0
        for result in await asyncio.gather(*(r.wait() for r in started)):
            status[result.status] = status.get(result.status, 0) + 1
        wall = loop.time() - t0
    return timings, wall, submitted, rss, status


async def measure_runs(runs: int = 10_000, steps: int = 5, sleep_s: float = 0.5, url: str = "memory://",
                       ) -> ScaleResult:
    """Run the asyncio baseline, then the engine, in this process; return both phases."""
    result = ScaleResult(runs, steps, sleep_s, url)
    timings, wall, submitted, rss = await _baseline(runs, steps, sleep_s)
    _fill_phase(result.baseline, timings, wall, submitted, rss, runs)
    del timings
    etimings, ewall, esubmitted, erss, status = await _engine(runs, steps, sleep_s, url)
    _fill_phase(result.engine, etimings, ewall, esubmitted, erss, runs)
    result.status = status
    return result


# -- listing a big journal ----------------------------------------------------------------------------------------
@dataclass
class ListingResult:
    """The listing measurement on one journal."""

    url: str
    runs: int
    steps: int
    fill_s: float = 0.0
    journal_mb: float | None = None
    fold_all_s: float = 0.0  # every event read and folded: `planweave runs` before summaries
    list_first_s: float = 0.0  # list_runs(limit=50) on a freshly opened journal
    list_s: float = 0.0  # best of 5 list_runs(limit=50)
    list_failed_s: float = 0.0  # best of 5 list_runs(status=failed, limit=50)
    cli_s: float | None = None  # `planweave runs --limit 50 --json` as a process, wall time
    cli_startup_s: float | None = None  # `planweave --help` as a process: Python and import time alone


def _listing_plan(steps: int) -> Any:
    from planweave.core.plan.graph import parse_plan_document, validate_plan

    doc = {"name": "filler", "steps": [{"id": f"s{k}", "tool": "noop", **({"after": [f"s{k - 1}"]} if k else {})}
                                       for k in range(steps)]}
    return validate_plan(parse_plan_document(doc, "bench scale"), version=1, source="bench scale")


async def fill_journal(url: str, runs: int, steps: int, *, now: float | None = None) -> float:
    """Write ``runs`` runs of ``steps`` steps into the journal at ``url`` as the engine would (events, outputs and
    tracked states, so summaries are written per batch): 90% succeeded, 5% failed, 5% left running by a process
    that is gone; created one a minute, the newest now. Returns the seconds it took."""
    from planweave.core.events import Event
    from planweave.core.state import RunState
    from planweave.journal import open_journal

    plan = _listing_plan(steps)
    document = plan.to_document()
    # Above Linux's largest pid (2**22): no such process here, so the runs it left running show as interrupted.
    gone = {"pid": 2**22 + 1, "host": socket.gethostname()}
    end = time.time() if now is None else now
    t0 = time.perf_counter()
    async with open_journal(url) as journal:
        for i in range(runs):
            run_id = f"fill-{i:06d}"
            at = end - (runs - i) * 60.0
            state = RunState(run_id, plan, plan.order)
            journal.track(run_id, state)

            def emit(kind: Any, step: str | None, data: dict[str, Any], when: float,
                     rid: str = run_id, st: RunState = state) -> None:
                event = Event(rid, kind, when, step, data)
                journal.append(event)
                st.apply(event)

            emit("run_created", None, {"plan": document, "version": 1, "idempotent": list(plan.order),
                                       "source": "bench scale", "on_failure": "stop", "owner": gone}, at)
            fate = "failed" if i % 20 == 7 else "running" if i % 20 == 13 else "succeeded"
            last = steps if fate == "succeeded" else steps // 2
            for k in range(last):
                sid = f"s{k}"
                emit("step_started", sid, {"attempt": 1}, at + k)
                if fate == "failed" and k == last - 1:
                    emit("step_failed", sid, {"attempt": 1, "error": "bench: it broke", "kind": "error",
                                              "final": True}, at + k + 0.5)
                else:
                    ref = journal.put_blob({"run": i, "step": k})
                    emit("step_succeeded", sid, {"attempt": 1, "output": ref}, at + k + 0.5)
            if fate != "running":
                emit("run_finished", None, {"status": fate, "error": "bench: it broke" if fate == "failed" else None},
                     at + last + 1)
            if i % 200 == 199:
                await journal.flush()
    return time.perf_counter() - t0


async def _fold_all(url: str) -> int:
    """What ``planweave runs`` did before summaries: read every event and fold every run."""
    from planweave.core.events import Event
    from planweave.journal import open_journal
    from planweave.journal.summary import fold_summary

    async with open_journal(url) as journal:
        by_run: dict[str, list[Event]] = {}
        for event in await journal.read(None):
            by_run.setdefault(event.run_id, []).append(event)
    return len([fold_summary(run_id, events) for run_id, events in by_run.items()])


async def _time_listing(url: str, query: Any, repeats: int) -> tuple[float, float]:
    from planweave.journal import open_journal

    t0 = time.perf_counter()
    async with open_journal(url) as journal:
        await journal.list_runs(query)
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(repeats):
            t1 = time.perf_counter()
            page = await journal.list_runs(query)
            best = min(best, time.perf_counter() - t1)
        assert len(page.runs) == min(query.limit, len(page.runs))
    return first, best


def _cli_wall(args: Sequence[str], url: str) -> float | None:
    exe = shutil.which("planweave") or str(Path(sys.executable).with_name("planweave"))
    if not Path(exe).exists():
        return None
    env = {**os.environ, "PLANWEAVE_JOURNAL": url}
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([exe, *args], env=env, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


async def measure_listing(url: str, runs: int = 10_000, steps: int = 10, *, fill: bool = True,
                          cli: bool = True) -> ListingResult:
    """Fill the journal (unless ``fill`` is False: it already holds the runs), then time the listings."""
    from planweave.journal.summary import RunQuery

    result = ListingResult(url, runs, steps)
    if fill:
        result.fill_s = await fill_journal(url, runs, steps)
    if url.startswith("sqlite:"):
        from planweave.journal.sqlite import path_of

        path = Path(path_of(url))
        result.journal_mb = sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20
    t0 = time.perf_counter()
    await _fold_all(url)
    result.fold_all_s = time.perf_counter() - t0
    result.list_first_s, result.list_s = await _time_listing(url, RunQuery(limit=50), 5)
    _, result.list_failed_s = await _time_listing(url, RunQuery(statuses=frozenset({"failed"}), limit=50), 5)
    if cli:
        result.cli_s = _cli_wall(["runs", "--limit", "50", "--json"], url)
        result.cli_startup_s = _cli_wall(["--help"], url)
    return result


# -- printing -----------------------------------------------------------------------------------------------------
def _ratio(value: float, base: float) -> str:
    return f"{value / base:,.3g}x" if base > 0 else "-"


def runs_table(result: ScaleResult) -> str:
    """The runs measurement as a text table, the engine beside the baseline with ratios."""
    b, e = result.baseline, result.engine
    rows = [
        ("submit all runs (s)", f"{b.start_s:,.2f}", f"{e.start_s:,.2f}", _ratio(e.start_s, b.start_s)),
        ("wall time (s)", f"{b.wall_s:,.2f}", f"{e.wall_s:,.2f}", _ratio(e.wall_s, b.wall_s)),
        ("runs/s", f"{b.runs_per_s:,.0f}", f"{e.runs_per_s:,.0f}", _ratio(e.runs_per_s, b.runs_per_s)),
        ("peak RSS (MiB)", f"{b.peak_rss_mb:,.0f}", f"{e.peak_rss_mb:,.0f}", _ratio(e.peak_rss_mb, b.peak_rss_mb)),
        ("RSS growth (MiB)", f"{b.rss_growth_mb:,.0f}", f"{e.rss_growth_mb:,.0f}",
         _ratio(e.rss_growth_mb, b.rss_growth_mb)),
        ("RSS per run (KiB)", f"{b.rss_growth_mb * 1024 / result.runs:,.1f}",
         f"{e.rss_growth_mb * 1024 / result.runs:,.1f}", _ratio(e.rss_growth_mb, b.rss_growth_mb)),
        ("ready-to-start p50 (ms)", f"{b.p50_ms:,.2f}", f"{e.p50_ms:,.2f}", _ratio(e.p50_ms, b.p50_ms)),
        ("ready-to-start p99 (ms)", f"{b.p99_ms:,.2f}", f"{e.p99_ms:,.2f}", _ratio(e.p99_ms, b.p99_ms)),
        ("ready-to-start mean (ms)", f"{b.mean_ms:,.2f}", f"{e.mean_ms:,.2f}", _ratio(e.mean_ms, b.mean_ms)),
        ("after the burst: steps", f"{b.steady_steps:,}", f"{e.steady_steps:,}", ""),
        ("after the burst: p50 (ms)", f"{b.steady_p50_ms:,.2f}", f"{e.steady_p50_ms:,.2f}",
         _ratio(e.steady_p50_ms, b.steady_p50_ms)),
        ("after the burst: p99 (ms)", f"{b.steady_p99_ms:,.2f}", f"{e.steady_p99_ms:,.2f}",
         _ratio(e.steady_p99_ms, b.steady_p99_ms)),
    ]
    head = (f"{result.runs:,} concurrent runs x {result.steps} chained steps sleeping {result.sleep_s:g} s, one "
            f"process (journal {result.journal}); runs ended: {result.status}")
    return _table(head, ("", "asyncio tasks", "planweave", "ratio"), rows)


def listing_table(result: ListingResult) -> str:
    """The listing measurement as a text table, each listing against folding every event."""
    fold = result.fold_all_s

    def row(name: str, value: float | None) -> tuple[str, str, str]:
        if value is None:
            return (name, "-", "-")
        return (name, f"{value:,.3f}", _ratio(value, fold) if fold > 0 else "-")

    rows = [row("fold every event (runs before summaries)", fold),
            row("list_runs(limit=50), fresh connection", result.list_first_s),
            row("list_runs(limit=50)", result.list_s),
            row("list_runs(status=failed, limit=50)", result.list_failed_s),
            row("`planweave runs --limit 50 --json` process", result.cli_s),
            row("`planweave --help` process (start-up alone)", result.cli_startup_s)]
    size = f", {result.journal_mb:,.0f} MiB" if result.journal_mb is not None else ""
    head = (f"{result.runs:,} runs x {result.steps} steps in {_safe(result.url)}{size} (filled in "
            f"{result.fill_s:,.1f} s)")
    return _table(head, ("", "seconds", "vs fold"), rows)


def _safe(url: str) -> str:
    from planweave.journal import redact_url

    return redact_url(url) if url.startswith("postgres") else url


def _table(head: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    lines = [head, "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(columns, widths,
                                                                                                  strict=True)))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Options:
    runs: int
    steps: int | None
    sleep: float
    journal: str | None
    listing: bool
    no_cli: bool
    json: bool


def _options(
    runs: Annotated[int, typer.Option(min=1, help="runs")] = 10_000,
    steps: Annotated[int | None, typer.Option(min=1, help="steps per run (default 5; with --listing 10)",
                                              show_default=False)] = None,
    sleep: Annotated[float, typer.Option(min=0.0, help="seconds each step sleeps")] = 0.5,
    journal: Annotated[str | None, typer.Option(
        help="journal URL (default memory://; with --listing a fresh SQLite file in a temporary directory). With "
             "--listing a postgresql:// URL gets a fresh schema, dropped after.", show_default=False)] = None,
    listing: Annotated[bool, typer.Option("--listing", help="measure listing a big journal instead")] = False,
    no_cli: Annotated[bool, typer.Option("--no-cli", help="with --listing: do not time the CLI as a process")
                      ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> _Options:
    """Many runs on one machine: N concurrent small runs in one engine beside plain asyncio tasks (default), or
    (--listing) listing runs of a journal filled with N runs."""
    return _Options(runs, steps, sleep, journal, listing, no_cli, json_output)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (or JSON); a bad option exits 2 naming it (SystemExit)."""
    args = parse_command_line(_options, argv, "planweave bench scale")
    if args.listing:
        return _main_listing(args)
    steps = args.steps or 5
    result = asyncio.run(measure_runs(args.runs, steps, args.sleep, args.journal or "memory://"))
    print(json.dumps(asdict(result), indent=2) if args.json else runs_table(result))
    return 0


def _main_listing(args: _Options) -> int:
    steps = args.steps or 10
    url = args.journal
    tmp = None
    schema = None
    server = url  # a PostgreSQL server's URL without the schema: where the schema is dropped from
    if url is None:
        tmp = tempfile.mkdtemp(prefix="planweave-scale-")
        url = f"sqlite:///{tmp}/runs.db"
    elif url.startswith(("postgresql://", "postgres://")) and "schema=" not in url:
        schema = f"pw_scale_{os.getpid()}"
        url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    try:
        result = asyncio.run(measure_listing(url, args.runs, steps, cli=not args.no_cli))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if schema is not None and server is not None:
            _drop_schema(server, schema)
    print(json.dumps(asdict(result), indent=2) if args.json else listing_table(result))
    return 0


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    raise SystemExit(main())
