"""Tools for the workers' process tests (``planweave worker --tools tests.workers.worker_tools:toolbox``).

Every tool is idempotent: a run taken over after its worker died re-runs the steps that were running (resume
semantics), so the tests can demand that every run succeeds.
"""

from __future__ import annotations

import asyncio
import os

from planweave import Toolbox

GATE_POLL_S = 0.02


async def pause(seconds: float = 0.05, value: int = 0) -> int:
    """Sleep ``seconds``, then return ``value``."""
    await asyncio.sleep(seconds)
    return value


async def wait_for(gate: str, value: int = 0) -> int:
    """Wait until the file ``gate`` exists (another process opens it), then return ``value``."""
    # Polling on purpose: the gate is opened by another process, so nothing in this one could be awaited instead.
    while not os.path.exists(gate):  # noqa: ASYNC110, ASYNC240 (a stat; see above)
        await asyncio.sleep(GATE_POLL_S)
    return value


toolbox = Toolbox()
toolbox.add(pause, idempotent=True)
toolbox.add(wait_for, idempotent=True)
