"""Clocks: the real one, and a virtual one on which time jumps to the next timer whenever every task is waiting.

The virtual clock is an event loop whose ``time()`` is virtual: ``asyncio.sleep``, ``asyncio.timeout`` and
``loop.call_later`` all run on it, so a plan that takes years finishes in milliseconds, deterministically. Time does
not jump while work runs in a thread (``to_thread``/``run_in_executor``: sync tools, journal writes): that work
takes real time, and the clock waits for it. Sockets and subprocesses are not waited for: on the virtual clock, a
timer can fire before their answer arrives.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Clock(Protocol):
    """Where the engine reads time. ``now()`` stamps events; waiting uses the running loop's timers."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock time: ``now()`` is seconds since the Unix epoch."""

    # time.time itself, not a method calling it: the engine reads the time twice per step (one Python frame less
    # each: docs/benchmarks.md, "the event nobody sees").
    now = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of blocking until the next timer, advances virtual time to it."""

    loop: VirtualEventLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only real I/O (threads, sockets) can wake us, so block for it
            return super().select(None)
        ready = super().select(0)
        if ready or timeout <= 0:
            return ready
        if self.loop.threads_busy:
            # Work in a thread (a sync tool, a journal write) takes real time: wait for it rather than let the
            # virtual clock run ahead of it.
            return super().select(None)
        self.loop.advance_to_next_timer(timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time starting at 0.0 (see the module docstring)."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0
        self._executor_jobs = 0

    def time(self) -> float:
        return self._virtual_now

    @property
    def threads_busy(self) -> bool:
        """Whether work handed to an executor (``to_thread``, ``run_in_executor``) is still running."""
        return self._executor_jobs > 0

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[Ts]], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._executor_jobs += 1
        future.add_done_callback(self._executor_job_done)
        return future

    def _executor_job_done(self, _future: asyncio.Future[Any]) -> None:
        self._executor_jobs -= 1

    def advance_to_next_timer(self, timeout: float) -> None:
        scheduled = getattr(self, "_scheduled", None)
        target = scheduled[0].when() if scheduled else self._virtual_now + timeout
        self._virtual_now = max(self._virtual_now, target)
        # The loop fires timers due before now + resolution; far from 0, one float ulp exceeds the default 1 ns,
        # and a timer due exactly now would never fire.
        self._clock_resolution = max(1e-9, 2 * math.ulp(self._virtual_now))


class VirtualClock:
    """Virtual time, read from the running :class:`VirtualEventLoop`; use :func:`run_virtual` to run on it."""

    def now(self) -> float:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, VirtualEventLoop):
            raise RuntimeError("VirtualClock needs its event loop: run the program with planweave.run_virtual()")
        return loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualEventLoop` (like ``asyncio.run``)."""
    with asyncio.Runner(loop_factory=VirtualEventLoop) as runner:
        return runner.run(main)
