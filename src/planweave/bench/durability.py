"""``planweave bench durability``: SIGKILL a fan-out of side effects at seeded points, resume, count what went wrong.

The workload (:mod:`planweave.bench.durability_effects`): F steps in parallel, each sleeping a seeded duration then
appending one line to a file (even steps keyed, so idempotent; odd steps plain), and a keyed join after them. Each
system runs it in a child process of its own program (``durability_planweave``, ``durability_langgraph``,
``durability_dbos``), written the way that system documents. One seeded schedule serves every system: run i is
killed (SIGKILL) after k effects were written, or t ms after the child said it was about to start. A child of the
same program then resumes the run as its system documents, and the files say:

- **duplicated**: extra lines of a step (plain steps; a keyed step's key keeps its file to one line);
- **lost**: steps without their line in a run the system reported finished;
- **could not resume**: runs the resume did not finish (left for a person, failed, timed out, or nothing recorded
  although effects had happened); a run killed before its system recorded it and before any effect is counted
  apart (*not recorded*: there is nothing to resume and nothing was done);
- **marked done**: runs finished once a step whose outcome was unknown and whose effect the file shows was marked done
  (planweave: ``resume --done``, a person's word the benchmark gives after reading the file), apart from *resumed*;
- **re-executed**: steps whose body ended in the killed process and began again in the resuming one;
- **resume time**: from spawning the resuming process to its report (interpreter, imports, store), and within it
  from the resume call to the end.

Peers are optional (``pip install -e .[bench]``); one that is not installed, or whose store is unreachable, is a
skipped row naming the reason. PostgreSQL systems get a database of their own, created and dropped here.
"""

from __future__ import annotations

import json
import os
import platform
import random
import selectors
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from planweave.bench.cli import parse_command_line
from planweave.bench.durability_effects import (
    EFFECTS,
    JOIN,
    TRACE,
    ChildSpec,
    Mode,
    is_keyed,
    read_lines,
    step_ids,
)
from planweave.extras import installed

__all__ = ["SYSTEMS", "DurabilityResult", "Kill", "SystemResult", "main", "measure", "schedule", "table"]

READY_TIMEOUT_S = 60.0
RESUME_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class System:
    """A system under test: the child program that runs the workload and what it needs."""

    key: str
    label: str
    module: str
    needs: tuple[str, ...]  # modules that must be importable
    store: Literal["sqlite", "postgresql"]
    packages: tuple[str, ...]  # distributions whose versions are printed


SYSTEMS: dict[str, System] = {s.key: s for s in (
    System("planweave-sqlite", "planweave (SQLite journal)", "planweave.bench.durability_planweave", (),
           "sqlite", ("planweave",)),
    System("planweave-postgres", "planweave (PostgreSQL journal)", "planweave.bench.durability_planweave",
           ("psycopg",), "postgresql", ("planweave", "psycopg")),
    System("langgraph-sqlite", "LangGraph (SqliteSaver, durability=sync)", "planweave.bench.durability_langgraph",
           ("langgraph", "langgraph.checkpoint.sqlite"), "sqlite", ("langgraph", "langgraph-checkpoint-sqlite")),
    System("langgraph-postgres", "LangGraph (PostgresSaver, durability=sync)",
           "planweave.bench.durability_langgraph", ("langgraph", "langgraph.checkpoint.postgres", "psycopg"),
           "postgresql", ("langgraph", "langgraph-checkpoint-postgres")),
    System("dbos", "DBOS (PostgreSQL system database)", "planweave.bench.durability_dbos", ("dbos",),
           "postgresql", ("dbos",)),
)}


@dataclass(frozen=True)
class Kill:
    """When run ``index`` is killed: after ``after_effects`` lines were written, or ``after_ms`` after READY."""

    index: int
    durations_ms: tuple[int, ...]
    after_effects: int | None = None
    after_ms: int | None = None

    def describe(self) -> str:
        return f"after {self.after_effects} effect(s)" if self.after_effects is not None else f"at {self.after_ms} ms"


def schedule(seed: int, runs: int, fan_out: int, min_ms: int = 30, max_ms: int = 150) -> list[Kill]:
    """The seeded kill schedule every system is given: durations per step, then a kill by count or by time."""
    rng = random.Random(seed)
    kills = []
    for i in range(runs):
        durations = tuple(rng.randint(min_ms, max_ms) for _ in range(fan_out))
        if i % 2 == 0:
            kills.append(Kill(i, durations, after_effects=rng.randint(1, fan_out)))
        else:
            kills.append(Kill(i, durations, after_ms=rng.randint(5, max_ms + 20)))
    return kills


@dataclass
class RunRecord:
    """One run of one system: what the kill hit and what the resume made of it."""

    index: int
    kill: str
    killed: bool  # False: the run ended before the kill was due, so there was nothing to resume
    outcome: str  # completed, marked_done, not_recorded, not_found, needs_person, failed, timeout, not_killed
    detail: str = ""
    duplicated_plain: int = 0
    duplicated_keyed: int = 0
    lost: int = 0
    reexecuted: int = 0
    resume_s: float | None = None
    resume_call_s: float | None = None


@dataclass
class SystemResult:
    """The counts of one system over every run of the schedule (or why it was skipped)."""

    key: str
    label: str
    versions: dict[str, str]
    skipped: str | None = None
    runs: list[RunRecord] = field(default_factory=list)

    @property
    def killed(self) -> int:
        return sum(1 for r in self.runs if r.killed)

    @property
    def resumed(self) -> int:
        return sum(1 for r in self.runs if r.killed and r.outcome == "completed")

    @property
    def marked_done(self) -> int:
        """Runs finished once a person (the benchmark reading the effects file) marked a step done."""
        return sum(1 for r in self.runs if r.killed and r.outcome == "marked_done")

    @property
    def not_recorded(self) -> int:
        return sum(1 for r in self.runs if r.killed and r.outcome == "not_recorded")

    @property
    def not_resumed(self) -> int:
        return self.killed - self.resumed - self.marked_done - self.not_recorded

    def total(self, name: str) -> int:
        return sum(int(getattr(r, name)) for r in self.runs)

    def resume_median(self, name: str) -> float | None:
        values = [float(getattr(r, name)) for r in self.runs if r.killed and getattr(r, name) is not None]
        return statistics.median(values) if values else None

    def summary(self) -> dict[str, Any]:
        """The figures of the table, as JSON data."""
        reasons = Counter(r.outcome for r in self.runs
                          if r.killed and r.outcome not in ("completed", "marked_done", "not_recorded"))
        return {"runs": len(self.runs), "killed": self.killed, "not_recorded": self.not_recorded,
                "resumed": self.resumed, "marked_done": self.marked_done,
                "not_resumed": self.not_resumed, "not_resumed_by_reason": dict(reasons),
                "duplicated_plain": self.total("duplicated_plain"), "duplicated_keyed": self.total("duplicated_keyed"),
                "lost": self.total("lost"), "reexecuted": self.total("reexecuted"),
                "resume_s_median": self.resume_median("resume_s"),
                "resume_call_s_median": self.resume_median("resume_call_s")}


@dataclass
class DurabilityResult:
    seed: int
    runs: int
    fan_out: int
    platform: str
    postgres: str | None
    systems: list[SystemResult]


# -- the stores -------------------------------------------------------------------------------------------------


def _database_url(base: str, name: str) -> str:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


def _admin(base: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(statement.encode())


def _postgres_version(base: str) -> str | None:
    if not installed("psycopg"):
        return None
    import psycopg

    try:
        with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error:
        return None
    return str(row[0]) if row else None


def _versions(system: System) -> dict[str, str]:
    found: dict[str, str] = {}
    for package in system.packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    if system.store == "sqlite":
        found["sqlite"] = sqlite3.sqlite_version
    return found


def _skip_reason(system: System, pg_version: str | None) -> str | None:
    missing = [m for m in system.needs if not installed(m)]
    if missing:
        return f"not installed (module {missing[0]!r}): pip install -e '.[bench]'"
    if system.store == "postgresql" and pg_version is None:
        return "the PostgreSQL server is not reachable (--pg)"
    return None


# -- one run ----------------------------------------------------------------------------------------------------


def _spawn(system: System, spec: ChildSpec, log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    with log.open("a") as err:
        return subprocess.Popen([sys.executable, "-m", system.module, spec.to_json()], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)


def _await_line(proc: subprocess.Popen[str], prefix: str, timeout: float) -> dict[str, Any] | None:
    """The data of the child's next ``prefix`` line, or None if it exited (or the time ran out) first."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=deadline - time.monotonic()):
                break
            line = proc.stdout.readline()
            if not line:
                return None
            if line.startswith(prefix):
                rest = line[len(prefix):].strip()
                return json.loads(rest) if rest else {}
    return None


def _kill_at(proc: subprocess.Popen[str], kill: Kill, effects: Path) -> bool:
    """SIGKILL ``proc`` at ``kill``'s point; False if it ended by itself first."""
    began = time.monotonic()
    while proc.poll() is None:
        if kill.after_effects is not None:
            due = len(read_lines(effects)) >= kill.after_effects
        else:
            due = (time.monotonic() - began) * 1000 >= (kill.after_ms or 0)
        if due:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.0005)
    return False


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _count(record: RunRecord, run_dir: Path, fan_out: int, killed_pid: int) -> None:
    lines = Counter(read_lines(run_dir / EFFECTS))
    steps = [*step_ids(fan_out), JOIN]
    for sid in steps:
        extra = max(0, lines[sid] - 1)
        if is_keyed(sid):
            record.duplicated_keyed += extra
        else:
            record.duplicated_plain += extra
    if record.outcome in ("completed", "marked_done"):
        record.lost = sum(1 for sid in steps if lines[sid] == 0)
    elif record.outcome == "not_found" and not lines:
        record.outcome = "not_recorded"  # killed before the system recorded the run, and before any effect
    ended_before: set[str] = set()
    began_after: set[str] = set()
    for line in read_lines(run_dir / TRACE):
        sid, what, pid = line.split()
        if int(pid) == killed_pid and what == "end":
            ended_before.add(sid)
        elif int(pid) != killed_pid and what == "begin":
            began_after.add(sid)
    record.reexecuted = len(ended_before & began_after)


def _one_run(system: System, store: str, kill: Kill, root: Path, tag: str) -> RunRecord:
    run_dir = root / f"run{kill.index:03d}"
    run_dir.mkdir(parents=True)
    log = run_dir / "child.log"
    run_id = f"dur-{tag}-{kill.index:03d}"
    store_here = str(run_dir / "store.db") if system.store == "sqlite" else store

    def spec(mode: Mode) -> ChildSpec:
        return ChildSpec(system.key, mode, run_id, str(run_dir), store_here, kill.durations_ms)

    record = RunRecord(kill.index, kill.describe(), killed=False, outcome="not_killed")
    first = _spawn(system, spec("start"), log)
    try:
        if _await_line(first, "READY", READY_TIMEOUT_S) is None:
            record.outcome, record.detail = "failed", f"the starting process never got ready (see {log})"
            return record
        record.killed = _kill_at(first, kill, run_dir / EFFECTS)
    finally:
        _stop(first)
    if not record.killed:
        _count(record, run_dir, len(kill.durations_ms), first.pid)
        return record
    spawned = time.perf_counter()
    second = _spawn(system, spec("resume"), log)
    try:
        done = _await_line(second, "DONE", RESUME_TIMEOUT_S)
        if done is None:
            try:
                second.wait(timeout=5)  # an EOF comes just before the exit status can be reaped
            except subprocess.TimeoutExpired:
                pass
            record.outcome = "timeout" if second.poll() is None else "failed"
            record.detail = f"the resuming process gave no result (see {log})"
        else:
            record.resume_s = time.perf_counter() - spawned
            record.resume_call_s = float(done.get("call_s", 0.0))
            record.outcome, record.detail = str(done["outcome"]), str(done.get("detail", ""))
    finally:
        _stop(second)
    _count(record, run_dir, len(kill.durations_ms), first.pid)
    return record


def _measure_system(system: System, kills: Sequence[Kill], pg: str, pg_version: str | None, root: Path,
                    progress: Callable[[str], None]) -> SystemResult:
    result = SystemResult(system.key, system.label, _versions(system))
    result.skipped = _skip_reason(system, pg_version)
    if result.skipped is not None:
        progress(f"{system.key}: skipped, {result.skipped}")
        return result
    tag = uuid.uuid4().hex[:8]
    database = f"pw_durability_{tag}_{system.key.replace('-', '_')}"
    store = ""
    if system.store == "postgresql":
        _admin(pg, f'CREATE DATABASE "{database}"')
        store = _database_url(pg, database)
    try:
        for kill in kills:
            record = _one_run(system, store, kill, root / system.key, tag)
            progress(f"{system.key}: run {kill.index} killed {kill.describe()}: {record.outcome}"
                     + (f" ({record.detail})" if record.detail and record.outcome != "completed" else ""))
            result.runs.append(record)
    finally:
        if system.store == "postgresql":
            _admin(pg, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return result


def measure(seed: int, runs: int, fan_out: int, systems: Sequence[str], pg: str,
            progress: Callable[[str], None] = lambda message: None, keep: Path | None = None) -> DurabilityResult:
    """Run the schedule of ``seed`` on each of ``systems`` and count; files under ``keep`` (else a temp dir)."""
    kills = schedule(seed, runs, fan_out)
    pg_version = _postgres_version(pg)
    results = []
    with tempfile.TemporaryDirectory(prefix="planweave-durability-") as tmp:
        root = keep if keep is not None else Path(tmp)
        for key in systems:
            results.append(_measure_system(SYSTEMS[key], kills, pg, pg_version, root, progress))
    return DurabilityResult(seed, runs, fan_out, f"Python {platform.python_version()}, {platform.machine()}",
                            pg_version, results)


# -- output -----------------------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(result: DurabilityResult) -> str:
    """The result as a Markdown table, the versions and the reasons runs did not resume."""
    lines = [
        f"durability: {result.runs} runs per system, fan-out {result.fan_out} (half keyed) + join, seed "
        f"{result.seed}; {result.platform}; PostgreSQL {result.postgres or 'not reachable'}",
        "",
        "| system | killed | not recorded | resumed | marked done | not resumed | dup. plain | dup. keyed | lost "
        "| re-executed | resume s (process) | resume s (call) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for s in result.systems:
        if s.skipped is not None:
            lines.append(f"| {s.label} | skipped: {s.skipped} |||||||||||")
            continue
        m = s.summary()
        lines.append(f"| {s.label} | {m['killed']}/{m['runs']} | {m['not_recorded']} | {m['resumed']} | "
                     f"{m['marked_done']} | {m['not_resumed']} | "
                     f"{m['duplicated_plain']} | {m['duplicated_keyed']} | {m['lost']} | {m['reexecuted']} | "
                     f"{_seconds(m['resume_s_median'])} | {_seconds(m['resume_call_s_median'])} |")
        if m["not_resumed_by_reason"]:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(m["not_resumed_by_reason"].items()))
            notes.append(f"- {s.label}: not resumed: {reasons}")
    lines.append("")
    lines.append("versions: " + "; ".join(
        f"{s.key}: " + ", ".join(f"{p} {v}" for p, v in s.versions.items()) for s in result.systems))
    lines.extend(notes)
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    seed: int
    runs: int
    fan_out: int
    systems: tuple[str, ...]
    pg: str
    keep: Path | None
    json: bool


def _options(
    runs: Annotated[int | None, typer.Option(min=1, help="runs per system (default 12; --quick: 4)",
                                             show_default=False)] = None,
    fan_out: Annotated[int | None, typer.Option(min=2, help="parallel effect steps per run (default 8; --quick: 4)",
                                                show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="seed of the kill schedule and the step durations")] = 7,
    systems: Annotated[str, typer.Option(help="systems to measure, comma-separated: " + ", ".join(SYSTEMS))
                       ] = ",".join(SYSTEMS),
    pg: Annotated[str | None, typer.Option(
        help="PostgreSQL server (a database per system is created and dropped; default $PLANWEAVE_TEST_PG or "
             "postgresql://postgres@127.0.0.1:5432/test)", show_default=False)] = None,
    quick: Annotated[bool, typer.Option("--quick", help="few kills and a small fan-out (what CI runs)")] = False,
    keep: Annotated[Path | None, typer.Option(help="keep every run's files (effects, traces, logs) under this "
                                                   "directory", show_default=False)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> _Options:
    """SIGKILL a fan-out of side effects at seeded points on planweave and its peers, resume, and count."""
    chosen = tuple(s.strip() for s in systems.split(",") if s.strip())
    unknown = [s for s in chosen if s not in SYSTEMS]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown system {unknown[0]!r} (known: {', '.join(SYSTEMS)})" if unknown
                                 else "no system given", param_hint="--systems")
    url = pg if pg is not None else os.environ.get("PLANWEAVE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise typer.BadParameter(f"{keep} is not empty", param_hint="--keep")
    return _Options(seed, runs or (4 if quick else 12), fan_out or (4 if quick else 8), chosen, url, keep,
                    json_output)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (or JSON); a bad option exits 2 naming it (SystemExit)."""
    args = parse_command_line(_options, argv, "planweave bench durability")
    # A SIGTERM unwinds like Ctrl-C, so the children are killed and the databases created here dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    result = measure(args.seed, args.runs, args.fan_out, args.systems, args.pg,
                     progress=lambda message: print(message, file=sys.stderr, flush=True), keep=args.keep)
    if args.json:
        data = asdict(result)
        for entry, system in zip(data["systems"], result.systems, strict=True):
            entry["summary"] = system.summary()
        print(json.dumps(data, indent=2))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
