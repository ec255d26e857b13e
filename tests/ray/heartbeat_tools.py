"""Tools for tests/ray/test_ray_heartbeat.py: top-level functions, so a Ray worker imports them by reference."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from planweave import Toolbox, current_step


def hold(log: str, seconds: float) -> str:
    """Write ``log``.started, hold the step's Ray resources for ``seconds`` (beating), then write ``log``.ended
    (a sync tool: it runs on a Ray worker)."""
    Path(log + ".started").write_text(str(time.time()))
    step = current_step()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        step.heartbeat()
        time.sleep(0.05)
    Path(log + ".ended").write_text(str(time.time()))
    return "held"


async def wait_for(path: str) -> str:
    """Return once the file ``path`` exists (an engine-side step: runs with executor: local)."""
    while not Path(path).exists():  # noqa: ASYNC110, ASYNC240 (another process writes it: nothing else to wait on)
        await asyncio.sleep(0.02)
    return path


def quick(log: str) -> str:
    """Write when it started to ``log``; return at once (a sync tool: it runs on a Ray worker)."""
    Path(log).write_text(str(time.time()))
    return "quick"


async def silent(seconds: float) -> str:
    """Say nothing for ``seconds`` (longer than the step's heartbeat)."""
    await asyncio.sleep(seconds)
    return "never"


def tools() -> Toolbox:
    box = Toolbox()
    for fn in (hold, wait_for, quick, silent):
        box.add(fn, idempotent=True)
    return box
