"""Tools for the CLI's crash tests: every call appends its step id to a side-effect file, then waits.

Imported by ``planweave run --tools crashy_tools:toolbox`` in subprocesses (with this directory on PYTHONPATH).
"""

from __future__ import annotations

import asyncio
import os

from planweave import Toolbox

GATE_POLL_S = 0.02


async def append_then_wait(log: str, step: str, gate: str | None = None) -> None:
    """Append ``step`` to the file ``log``, then wait until the file ``gate`` exists (if given).

    The append is one ``write`` on an O_APPEND descriptor, done before the first await: a SIGKILL cannot tear it,
    and once the journal shows the step started, its line is in the file. The gate lets a test hold steps in
    ``running`` for as long as it needs (a file, because the test is another process).
    """
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step}\n".encode())
    finally:
        os.close(fd)
    # Polling on purpose: the gate is opened by another process, so nothing in this one could be awaited instead.
    while gate is not None and not os.path.exists(gate):  # noqa: ASYNC110, ASYNC240 (a stat; see above)
        await asyncio.sleep(GATE_POLL_S)


async def mark(step: str, log: str, seconds: float = 0.2, gate: str | None = None) -> dict[str, str]:
    """Append ``step`` to the file ``log``, wait until the file ``gate`` exists (if given), then sleep ``seconds``
    (see ``append_then_wait``)."""
    await append_then_wait(log, step, gate)
    await asyncio.sleep(seconds)
    return {"step": step}


toolbox = Toolbox()
toolbox.add(mark)  # not idempotent: a run interrupted while it runs needs --retry-unknown
toolbox.add(mark, name="mark_idempotent", idempotent=True)
