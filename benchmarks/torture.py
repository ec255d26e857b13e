"""Crash-resume torture: SIGKILL `planweave run` and then repeated `planweave resume` at random moments.

Each run is a plan of three chains of four steps and a join (13 steps), a seeded mix of idempotent and
non-idempotent ``effect`` steps (``tests/journal/effect_tools.py``) that append their id to a side-effect file
before they sleep. The CLI is started as a real process, killed with SIGKILL after a random delay, then resumed
(``--retry-unknown``, so interrupted non-idempotent steps run again) and killed again, up to ``--kills`` times, and
finally resumed to its end. After every kill the journal is read: a step the journal held as succeeded must never
append to the side-effect file again. Counted per backend:

- missing effects: steps the final journal shows succeeded with no line in the side-effect file (must be 0);
- finished re-runs: steps that ran again after the journal had recorded their success (must be 0);
- interrupted re-runs: steps running at a kill that ran again on resume (expected: at-least-once, not an error).

With ``--writers``, several processes then share one SQLite journal: writers run plans while readers poll
``planweave runs`` and ``planweave show``; failed commands and ``database is locked`` messages are counted.

    .venv/bin/python benchmarks/torture.py [--runs 3] [--kills 2] [--backends sqlite,postgres] [--seed 0]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from planweave.bench.cli import parse_command_line
from planweave.journal import open_journal

REPO = Path(__file__).resolve().parent.parent
TOOLS_DIR = REPO / "tests" / "journal"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Tally:
    """What the torture of one backend found."""

    runs: int = 0
    kills: int = 0
    processes: int = 0
    missing: int = 0
    finished_reruns: int = 0
    interrupted_reruns: int = 0
    unrecorded_starts: int = 0  # killed before its run_created was stored: started again from the plan file
    not_succeeded: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plan_for(rng: random.Random, log: Path) -> dict[str, Any]:
    """Three chains of four steps and a join; each step idempotent or not, sleeping 50-250 ms."""
    steps: list[dict[str, Any]] = []
    for chain in "abc":
        for i in range(1, 5):
            sid = f"{chain}{i}"
            tool = rng.choice(["effect", "effect_idempotent"])
            seconds = round(rng.uniform(0.05, 0.25), 3)
            step: dict[str, Any] = {"id": sid, "tool": tool, "args": {"step": sid, "log": str(log), "seconds": seconds}}
            if i > 1:
                step["after"] = [f"{chain}{i - 1}"]
            steps.append(step)
    steps.append({"id": "z", "tool": "effect", "after": ["a4", "b4", "c4"], "args": {"step": "z", "log": str(log)}})
    return {"name": "torture", "steps": steps}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOOLS_DIR), os.environ.get("PYTHONPATH", "")]),
            "NO_COLOR": "1"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "planweave.cli.main", *args]


def _effects(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


async def _journal_view(url: str, run_id: str) -> tuple[set[str], str, bool]:
    """(steps succeeded, the run's last status, whether run_created is stored) as the journal holds them now."""
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
    succeeded: set[str] = set()
    status = "running"
    for event in events:
        if event.kind == "step_succeeded" and event.step:
            succeeded.add(event.step)
        elif event.kind == "run_finished":
            status = str(event.data.get("status"))
        elif event.kind == "run_resumed":
            status = "running"
    return succeeded, status, bool(events)


def torture_run(url: str, run_id: str, work: Path, rng: random.Random, max_kills: int, tally: Tally) -> None:
    """One run: start it, kill it and its resumes at random, resume it to the end, and count what went wrong."""
    log = work / f"{run_id}.log"
    plan = work / f"{run_id}.yaml"
    plan.write_text(yaml.safe_dump(plan_for(rng, log)))
    base = ("--journal", url, "--tools", "effect_tools:toolbox")
    command = _cli("run", str(plan), "--run-id", run_id, *base)
    kills = rng.randint(1, max_kills)
    finished_before: set[str] = set()  # succeeded in the journal before the current process started
    for attempt in range(kills + 1):
        before = _effects(log)
        tally.kills += _run_process(command, work, None if attempt == kills else rng.uniform(0.4, 1.8))
        tally.processes += 1
        finished, status, created = asyncio.run(_journal_view(url, run_id))
        after = _effects(log)
        tally.finished_reruns += sum(1 for s in finished_before if after[s] > before[s])
        tally.interrupted_reruns += sum(1 for s in after if before[s] >= 1 and after[s] > before[s]
                                        and s not in finished_before)
        finished_before = finished
        if status != "running":
            break  # the run ended before the kill
        if created:
            command = _cli("resume", run_id, "--retry-unknown", *base)
        else:  # killed before run_created was stored: start it again from the plan
            tally.unrecorded_starts += 1
    finished, status, _ = asyncio.run(_journal_view(url, run_id))
    effects = _effects(log)
    tally.runs += 1
    tally.missing += sum(1 for s in finished if effects[s] == 0)
    if status != "succeeded":
        tally.not_succeeded.append(f"{run_id}: {status}")


def _run_process(command: list[str], cwd: Path, kill_after: float | None) -> int:
    """Run ``command`` to its end, or SIGKILL it after ``kill_after`` seconds; return 1 if it was killed."""
    proc = subprocess.Popen(command, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=120 if kill_after is None else kill_after)
        return 0
    except subprocess.TimeoutExpired:
        if kill_after is None:
            raise
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def torture_backend(url: str, work: Path, runs: int, max_kills: int, seed: int, budget: float) -> Tally:
    tally = Tally()
    start = time.perf_counter()
    for i in range(runs):
        if time.perf_counter() - start > budget:
            break
        rng = random.Random(f"{seed}/{url.partition(':')[0]}/{i}")
        torture_run(url, f"t{seed}-{i}", work, rng, max_kills, tally)
    tally.seconds = time.perf_counter() - start
    return tally


def shared_sqlite(work: Path, writers: int, readers: int, steps: int) -> dict[str, Any]:
    """Writers run plans on one SQLite file while readers poll `runs` and `show`; count failures and lock errors."""
    url = f"sqlite:///{work / 'shared.db'}"
    log = work / "shared.log"
    plan = {"steps": [{"id": f"s{i}", "tool": "effect_idempotent", "args": {"step": f"s{i}", "log": str(log)}}
                      for i in range(steps)]}
    path = work / "shared.yaml"
    path.write_text(yaml.safe_dump(plan))
    base = ("--journal", url, "--tools", "effect_tools:toolbox")
    start = time.perf_counter()
    procs = [subprocess.Popen(_cli("run", str(path), "--run-id", f"w{i}", *base), cwd=work, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(writers)]
    polls = failures = locked = 0
    while any(p.poll() is None for p in procs) or polls < readers:
        batch = []
        for r in range(readers):
            args = ("runs", "--journal", url) if r % 2 == 0 else ("show", f"w{r % writers}", "--journal", url, "--json")
            batch.append(subprocess.Popen(_cli(*args), cwd=work, env=_env(), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        for reader in batch:
            _, err = reader.communicate(timeout=120)
            polls += 1
            locked += "database is locked" in err
            # `show` of a writer's run that has not started yet is a clean "no run", not a failure
            failed = (reader.returncode != 0 and "no run" not in err) or "Traceback" in err
            if failed:
                print(f"reader failed ({reader.returncode}): {err.strip()[-300:]}", file=sys.stderr)
            failures += failed
    writer_failures = 0
    for p in procs:
        _, err = p.communicate(timeout=120)
        writer_failures += p.returncode != 0
        if p.returncode != 0:
            print(f"writer failed ({p.returncode}): {err.strip()[-300:]}", file=sys.stderr)
        locked += "database is locked" in err
    effects = _effects(log)
    return {"writers": writers, "readers": readers, "polls": polls, "failed commands": failures + writer_failures,
            "database is locked": locked, "effects": sum(effects.values()), "expected effects": writers * steps,
            "seconds": time.perf_counter() - start}


def _pg_url(base: str) -> tuple[str, str] | None:
    try:
        import psycopg

        psycopg.connect(base, connect_timeout=3).close()
    except Exception as exc:
        print(f"PostgreSQL at {base} unreachable, skipped: {exc}", file=sys.stderr)
        return None
    schema = f"torture_{secrets.token_hex(4)}"
    return f"{base}{'&' if '?' in base else '?'}schema={schema}", schema


def _drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def table(rows: list[list[str]], header: list[str]) -> str:
    """A Markdown table, numbers right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


@dataclass(frozen=True)
class TortureOptions:
    runs: int
    kills: int
    backends: tuple[str, ...]
    pg: str
    seed: int
    budget: float
    writers: int
    readers: int


def _options(  # one parameter per option, read by Typer
    runs: Annotated[int, typer.Option(min=1, help="runs per backend")] = 3,
    kills: Annotated[int, typer.Option(min=0, help="most SIGKILLs per run")] = 3,
    backends: Annotated[str, typer.Option(help="comma-separated: sqlite, postgres")] = "sqlite,postgres",
    pg: Annotated[str, typer.Option(help="PostgreSQL server", envvar="PLANWEAVE_TEST_PG")] = PG_DEFAULT,
    seed: Annotated[int, typer.Option(help="seed of the kill times")] = 0,
    budget: Annotated[float, typer.Option(help="seconds per backend before no new run starts")] = 25.0,
    writers: Annotated[int, typer.Option(min=0, help="SQLite writer processes for the shared-file part")] = 0,
    readers: Annotated[int, typer.Option(min=0, help="reader processes polling per round")] = 2,
) -> TortureOptions:
    """SIGKILL `planweave run` processes at random moments and resume them: no effect lost, none run twice."""
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    unknown = [b for b in chosen if b not in ("sqlite", "postgres")]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown backend {', '.join(unknown) or '(none)'}: use sqlite or postgres",
                                 param_hint="--backends")
    return TortureOptions(runs, kills, chosen, pg, seed, budget, writers, readers)


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(_options, argv, "python benchmarks/torture.py")
    rows = []
    bad = False
    with tempfile.TemporaryDirectory(prefix="planweave-torture-") as tmp:
        work = Path(tmp)
        for backend in args.backends:
            if backend == "sqlite":
                url, schema = f"sqlite:///{work / 'torture.db'}", None
            elif backend == "postgres":
                found = _pg_url(args.pg)
                if found is None:
                    continue
                url, schema = found
            else:  # refused by _options
                raise AssertionError(backend)
            try:
                tally = torture_backend(url, work, args.runs, args.kills, args.seed, args.budget)
            finally:
                if schema is not None:
                    _drop_schema(args.pg, schema)
            bad |= bool(tally.missing or tally.finished_reruns or tally.not_succeeded)
            rows.append([backend, str(tally.runs), str(tally.kills), str(tally.processes), str(tally.missing),
                         str(tally.finished_reruns), str(tally.interrupted_reruns), str(tally.unrecorded_starts),
                         str(len(tally.not_succeeded)), f"{tally.seconds:.1f}"])
            for problem in tally.not_succeeded:
                print(f"{backend}: run did not succeed: {problem}", file=sys.stderr)
        print(table(rows, ["backend", "runs", "kills", "processes", "missing effects", "finished re-runs",
                           "interrupted re-runs", "restarts before run_created", "not succeeded", "seconds"]))
        if args.writers:
            shared = shared_sqlite(work, args.writers, args.readers, steps=50)
            print()
            print(table([[str(v) if not isinstance(v, float) else f"{v:.1f}" for v in shared.values()]],
                        list(shared)))
            bad |= bool(shared["failed commands"] or shared["effects"] < shared["expected effects"])
    print(json.dumps({"seed": args.seed, "runs": args.runs, "kills": args.kills}), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
