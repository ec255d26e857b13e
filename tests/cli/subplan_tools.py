"""Tools for the sub-plan tests: every call appends its step id to a side-effect file (``$SUBPLAN_LOG``).

A call with ``gated`` waits until the file ``$SUBPLAN_GATE`` exists (when that is set): a test holds the step in
``running`` for as long as it needs, e.g. to kill the process under it. ``fail`` raises after the append.
Imported in-process by tests/planning/test_subplans.py and by ``planweave run --tools subplan_tools:toolbox``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from planweave import Toolbox

GATE_POLL_S = 0.02


async def mark(step: str, v: Any = None, gated: bool = False, fail: bool = False) -> dict[str, Any]:
    """Record that ``step`` ran (one O_APPEND write, before any await), wait for the gate if gated."""
    fd = os.open(os.environ["SUBPLAN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step}\n".encode())
    finally:
        os.close(fd)
    gate = os.environ.get("SUBPLAN_GATE")
    # Polling on purpose: the gate is opened by another process (or the test), nothing here could be awaited.
    while gated and gate and not os.path.exists(gate):  # noqa: ASYNC110, ASYNC240 (a stat; see above)
        await asyncio.sleep(GATE_POLL_S)
    if fail:
        raise ConnectionError(f"{step} is down")
    return {"step": step, "v": v}


toolbox = Toolbox()
toolbox.add(mark, name="mark_idempotent", idempotent=True)
