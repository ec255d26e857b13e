"""Tools that record their side effects, for the disk-full test and ``benchmarks/torture.py``.

Loaded by ``planweave run --tools effect_tools:toolbox`` in subprocesses (with this directory on PYTHONPATH). Every
``effect`` call appends its step id to a side-effect file with one ``write`` on an O_APPEND descriptor, before its
first await: a SIGKILL cannot tear the line, and once the journal shows the step started its line is in the file.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import time

from planweave import Toolbox


def _append(log: str, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


async def effect(step: str, log: str, seconds: float = 0.0, pad: int = 0) -> dict[str, str]:
    """Append ``step`` to the file ``log``, sleep ``seconds``, and return an output of about ``pad`` bytes."""
    _append(log, step)
    if seconds:
        await asyncio.sleep(seconds)
    return {"step": step, "pad": "x" * pad}


def fill(ballast: str, once: str, after_stored: str = "", db: str = "", chunk: int = 64 * 1024) -> dict[str, int]:
    """Fill the file system of ``ballast`` until it is full, once (the file ``once`` marks it done). Synchronous: it
    runs in a worker thread, where blocking is fine.

    With ``db`` and ``after_stored``, first wait until the SQLite journal ``db`` holds that step's success, so what
    the disk loses is decided by the plan, not by a race with the journal's writer. Idempotent: a re-run after the
    marker exists does nothing, so a resumed run does not fill the disk again.
    """
    if os.path.exists(once):
        return {"filled": 0}
    while db and not _stored(db, after_stored):
        time.sleep(0.01)  # another thread writes the journal: there is nothing to wait on instead
    _append(once, "filled")
    written = 0
    with open(ballast, "wb") as out:
        block = b"\0" * chunk
        try:
            while True:
                written += out.write(block)
                out.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return {"filled": written}


def _stored(db: str, step: str) -> bool:
    conn = sqlite3.connect(db, timeout=30)
    try:
        query = "SELECT 1 FROM events WHERE kind = 'step_succeeded' AND step = ?"
        return conn.execute(query, (step,)).fetchone() is not None
    finally:
        conn.close()


toolbox = Toolbox()
toolbox.add(effect)  # not idempotent: re-running it after a crash repeats its effect
toolbox.add(effect, name="effect_idempotent", idempotent=True)
toolbox.add(fill, idempotent=True)
