"""The side effects of ``planweave bench durability``, the same code under every system measured.

A run of the workload has a directory. Each step, whatever runs it, writes one line per effect to ``effects.log``
(the effect the benchmark counts: a line twice is a duplicated effect, a line missing from a finished run a lost
one) and traces its body in ``attempts.log`` (``STEP begin PID`` on entry, ``STEP end PID`` once its effect is
written), so that a step whose body ended in the killed process and began again in the resuming one is seen as
re-executed. A *keyed* effect is idempotent the way a real one is made so: it writes its line only if no line with
its key is there (under a file lock), so running it twice leaves one line; a *plain* effect appends every time.

The workload itself: steps ``e0 .. e{F-1}`` in parallel (even ones keyed, odd ones plain), each sleeping its
duration then writing its effect, and a keyed ``join`` after all of them. The child programs
(``durability_planweave``, ``durability_langgraph``, ``durability_dbos``) express it in each system's own way.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["EFFECTS", "JOIN", "TRACE", "ChildSpec", "Mode", "append_effect", "begin", "is_keyed", "read_lines",
           "report", "step_ids"]

EFFECTS = "effects.log"
TRACE = "attempts.log"
JOIN = "join"

Mode = Literal["start", "resume"]


@dataclass(frozen=True)
class ChildSpec:
    """What one child process runs: a system, start or resume, the run's id and directory, and the workload."""

    system: str
    mode: Mode
    run_id: str
    run_dir: str
    store: str  # the system's store: a SQLite file path or a postgresql:// URL
    durations_ms: tuple[int, ...]  # one per fan-out step

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        data = json.loads(text)
        data["durations_ms"] = tuple(data["durations_ms"])
        return cls(**data)


def step_ids(fan_out: int) -> list[str]:
    """The fan-out steps' ids, ``e0`` .. ``e{fan_out-1}``."""
    return [f"e{i}" for i in range(fan_out)]


def is_keyed(step: str) -> bool:
    """Whether ``step``'s effect is keyed (idempotent): the even fan-out steps and the join."""
    return step == JOIN or int(step[1:]) % 2 == 0


def _append(path: Path, line: str) -> None:
    # One write(2) on an O_APPEND descriptor: lines from parallel steps never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[str]:
    """The lines of ``path`` (none if it does not exist)."""
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def begin(run_dir: str, step: str) -> None:
    """Trace that ``step``'s body started in this process."""
    _append(Path(run_dir) / TRACE, f"{step} begin {os.getpid()}\n")


def append_effect(run_dir: str, step: str) -> None:
    """Write ``step``'s effect (keyed or plain, see :func:`is_keyed`), then trace that its body ended."""
    directory = Path(run_dir)
    effects = directory / EFFECTS
    if is_keyed(step):
        with (directory / "effects.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the check and the write as one, across threads and processes
            if step not in read_lines(effects):
                _append(effects, f"{step}\n")
    else:
        _append(effects, f"{step}\n")
    _append(directory / TRACE, f"{step} end {os.getpid()}\n")


def report(kind: str, **data: Any) -> None:
    """Tell the parent something on stdout: ``READY`` before the run starts or resumes, ``DONE {json}`` at the end."""
    sys.stdout.write(kind + (" " + json.dumps(data) if data else "") + "\n")
    sys.stdout.flush()
