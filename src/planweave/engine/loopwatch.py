"""A watchdog that notices when the event loop stops turning (a tool blocking it) and says which task did it.

An async tool that blocks (``time.sleep``, a sync HTTP call, a long computation) stops every other step, and its
own ``timeout`` cannot fire until it yields. Nothing can interrupt it; this makes it visible. A daemon thread posts
a no-op callback to the loop every ``threshold / 4`` seconds; a callback that waits longer than ``threshold`` means
the loop is blocked, and the task and the code running on it at that moment are the culprits.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

LOOP_STALL_S = 1.0
"""How long the loop may go without turning before a stall is reported."""

StallReport = Callable[["asyncio.Task[object] | None", "FrameType | None", float], None]
"""``(task, frame, since)``: called in the watchdog's thread when a stall is noticed, while the loop is still
blocked: ``frame`` is the innermost frame the loop's thread is executing, ``since`` the ``time.monotonic()`` at
which the loop was last known to be free (a callback scheduled then with ``call_soon_threadsafe`` runs as soon as
the loop turns again, and can measure the whole stall)."""


class LoopWatch:
    """Watches the running event loop from a daemon thread; :meth:`stop` ends the watch (never blocking).

    Create it in the loop's thread (it remembers that thread, to see what it executes during a stall).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, report: StallReport, threshold: float = LOOP_STALL_S) -> None:
        if threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._report = report
        self._threshold = threshold
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="planweave-loopwatch", daemon=True)

    def start(self) -> LoopWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        interval = self._threshold / 4
        while not self._stopped.wait(interval):
            turned = threading.Event()
            posted = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(turned.set)
            except RuntimeError:  # the loop is closed
                return
            if turned.wait(self._threshold):
                continue
            # asyncio.current_task reads the loop's current-task table: safe from here while the loop is stuck.
            task = asyncio.current_task(self._loop)
            frame = sys._current_frames().get(self._loop_thread)
            self._report(task, frame, posted)
            del frame  # frames hold their locals alive
            while not turned.wait(interval):  # one report per stall
                if self._stopped.is_set() or self._loop.is_closed():
                    return
