"""Tools that misbehave towards the process: they exit, interrupt, block, or leave threads behind.

Imported by ``planweave run --tools exit_tools:toolbox`` in subprocesses (with this directory on PYTHONPATH), and
by ``tests/tools/test_tool_faults.py`` for the same faults in-process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from planweave import Toolbox


async def exit_async(code: int = 3) -> None:
    """Raise SystemExit on the event loop's thread."""
    raise SystemExit(code)


def exit_sync(code: int = 3) -> None:
    """Call sys.exit in a worker thread."""
    sys.exit(code)


async def interrupt_async() -> None:
    """Raise KeyboardInterrupt on the event loop's thread."""
    raise KeyboardInterrupt


def interrupt_sync() -> None:
    """Raise KeyboardInterrupt in a worker thread."""
    raise KeyboardInterrupt


def block(seconds: float) -> dict[str, float]:
    """Block the worker thread (a sync tool that ignores cancellation)."""
    time.sleep(seconds)
    return {"blocked": seconds}


def leave_thread(seconds: float) -> str:
    """Start a non-daemon thread that outlives the call by ``seconds``, and return at once."""
    threading.Thread(target=time.sleep, args=(seconds,), name="left-behind").start()
    return "left a thread"


def stuck(seconds: float, pidfile: str) -> None:
    """Write this process's pid to ``pidfile``, then sleep (for process isolation: the pid is the worker's)."""
    with open(pidfile, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)


toolbox = Toolbox()
for fn in (exit_async, exit_sync, interrupt_async, interrupt_sync, block, leave_thread, stuck):
    toolbox.add(fn)
