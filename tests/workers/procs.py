"""Worker processes for the workers' tests, and the checks that read who ran what from the journal itself."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.workers.conftest import Schema

REPO = Path(__file__).resolve().parents[2]
TOOLS = "tests.workers.worker_tools:toolbox"


@dataclass
class WorkerProcess:
    """A ``planweave worker`` subprocess; its stderr (one line per claim, end, loss) goes to a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    _stream: IO[bytes] = field(repr=False)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 15) -> int | str:
        """SIGTERM (a clean stop: its runs go back to the queue) and wait; the exit code, or ``hung`` (killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return "hung"
        finally:
            self._stream.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._stream.close()


def start_worker(url: str, name: str, tmp: Path, *extra: str, env: Mapping[str, str] | None = None) -> WorkerProcess:
    """``planweave worker`` as ``name``: its stderr to ``tmp/NAME.log``, its stdout to ``tmp/NAME.out``; ``env``
    instead of this process's environment (less ``PLANWEAVE_JOURNAL``)."""
    log = tmp / f"{name}.log"
    stream = log.open("wb")
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PLANWEAVE_JOURNAL"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "planweave.cli.main", "worker", "--journal", url, "--name", name,
            "--tools", TOOLS, *extra]
    with (tmp / f"{name}.out").open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=stream)
    return WorkerProcess(name, proc, log, stream)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30, every: float = 0.05) -> None:
    """Poll ``check`` until it holds: the workers are other processes, so the journal is all there is to watch."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def started_by(pg: Schema, name: str) -> int:
    """Runs ``name`` holds now, has begun (a step started under its lease's epoch) and not finished."""
    ((n,),) = pg.query(
        "SELECT count(DISTINCT l.run_id) FROM {s}.planweave_leases l JOIN {s}.planweave_events e "
        "ON e.run_id = l.run_id AND e.lease_epoch = l.epoch AND e.kind = 'step_started' "
        "WHERE l.state = 'running' AND l.holder = %s AND NOT EXISTS (SELECT 1 FROM {s}.planweave_events f "
        "WHERE f.run_id = l.run_id AND f.kind = 'run_finished')", (name,))
    return int(n)


def held_by(pg: Schema, name: str) -> int:
    ((n,),) = pg.query("SELECT count(*) FROM {s}.planweave_leases WHERE state = 'running' AND holder = %s", (name,))
    return int(n)


def done(pg: Schema) -> int:
    ((n,),) = pg.query("SELECT count(*) FROM {s}.planweave_leases WHERE state = 'done'")
    return int(n)


@dataclass
class Attempt:
    run_id: str
    step: str
    epoch: int
    start: float
    end: float | None  # None: never ended in the journal (its worker died or lost the lease)
    outcome: str | None


def journal_problems(pg: Schema) -> tuple[list[str], dict[str, list[Attempt]]]:
    """What the journal says went wrong: writes by a holder after a newer one, a finished step started again,
    an attempt ended by another epoch than started it, or attempts of one step overlapping in time.

    Returns the problems and every step attempt by ``run/step``.
    """
    rows = pg.query("SELECT run_id, kind, step, at, lease_epoch FROM {s}.planweave_events ORDER BY pos")
    claimed = {(r, e): float(t) for r, e, t in pg.query(
        "SELECT run_id, epoch, extract(epoch FROM claimed_at) FROM {s}.planweave_lease_claims")}
    problems: list[str] = []
    newest: dict[str, int] = {}
    succeeded: set[tuple[str, str]] = set()
    open_attempt: dict[tuple[str, str], Attempt] = {}
    attempts: dict[str, list[Attempt]] = {}
    for run_id, kind, step, at, epoch in rows:
        if epoch is None:
            problems.append(f"run {run_id}: event {kind} has no lease epoch (written without a fence)")
            continue
        if epoch < newest.get(run_id, 0):
            problems.append(f"run {run_id}: event {kind} of epoch {epoch} written after epoch {newest[run_id]}")
        newest[run_id] = max(newest.get(run_id, 0), epoch)
        key = (run_id, step)
        if kind == "step_started":
            if key in succeeded:
                problems.append(f"run {run_id}: step {step} started again (epoch {epoch}) after it succeeded")
            attempt = Attempt(run_id, step, epoch, at, None, None)
            open_attempt[key] = attempt
            attempts.setdefault(f"{run_id}/{step}", []).append(attempt)
        elif kind in ("step_succeeded", "step_failed"):
            started = open_attempt.pop(key, None)
            if started is None:
                problems.append(f"run {run_id}: step {step} {kind} without an attempt started")
            elif started.epoch != epoch:
                problems.append(f"run {run_id}: step {step} started by epoch {started.epoch}, ended by {epoch}")
            else:
                started.end, started.outcome = at, kind
            if kind == "step_succeeded":
                succeeded.add(key)
    for where, tries in attempts.items():
        for before, after in itertools.pairwise(tries):
            # An attempt that never ended ran at most until the next epoch was claimed (its holder was fenced).
            end = before.end if before.end is not None else claimed.get((before.run_id, before.epoch + 1))
            if end is None or end > after.start:
                problems.append(f"{where}: the attempt of epoch {before.epoch} (until {end}) overlaps the attempt "
                                f"of epoch {after.epoch} (from {after.start})")
    return problems, attempts


def run_outcomes(pg: Schema) -> dict[str, Any]:
    """Each run's last ``run_finished`` status in the journal."""
    out: dict[str, Any] = {}
    for run_id, data in pg.query(
            "SELECT run_id, data FROM {s}.planweave_events WHERE kind = 'run_finished' ORDER BY pos"):
        out[run_id] = data["status"]
    return out
