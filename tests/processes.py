"""Other processes in tests (``planweave run``, ``planweave serve``): started with text pipes, read up to a line,
and never left behind, whatever the test asserts meanwhile."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal


@contextmanager
def running(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """``argv`` started with text pipes on stdout and stderr; on leaving the block it is killed if it still runs,
    reaped, and its pipes are closed (the test reads them with ``proc.communicate`` inside the block)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=None if env is None else dict(env), cwd=cwd)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def read_until(proc: subprocess.Popen[str], needle: str, *, stream: Literal["stdout", "stderr"] = "stdout",
               at_start: bool = False) -> list[str]:
    """Lines of ``proc``'s ``stream`` up to the first one containing ``needle`` (starting with it if ``at_start``).

    Fails, with what was read, if the process closes the stream first; the test's timeout bounds the wait.
    """
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None, f"{stream} of {proc.args!r} is not a pipe"
    seen: list[str] = []
    while True:
        line = pipe.readline()
        assert line, f"{proc.args!r} closed its {stream} before printing {needle!r}: {seen}"
        seen.append(line.rstrip("\n"))
        if line.startswith(needle) if at_start else needle in line:
            return seen


def journal_bytes(directory: Path, name: str = "runs.db") -> bytes:
    """Every byte of a SQLite journal's files in ``directory`` (main file, WAL, shared memory) as they are now; the
    rollback ``-journal`` of a process writing meanwhile may vanish between listing and reading."""
    out = []
    for f in directory.glob(f"{name}*"):
        with contextlib.suppress(FileNotFoundError):
            out.append(f.read_bytes())
    return b"".join(out)
