"""Waiting in tests without wall-clock margins: async tests on the virtual clock, and waits on a run's own events.

A test that sleeps "long enough" and then asserts, or polls in a loop, is slow when the machine is idle and flaky
when it is busy. Instead, a test either runs on virtual time (:func:`on_virtual_clock`: sleeps, timeouts and the
scripted model's token pace take no real time and always happen in the same order) or waits for the event that makes
its condition true (:func:`until`), with a generous cap that only bounds a hang.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

from planweave import Run, run_virtual
from planweave.core.state import RunState

P = ParamSpec("P")


def on_virtual_clock(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run the async test ``test`` to completion on a fresh :class:`planweave.core.clock.VirtualEventLoop`.

    Give the engines it opens ``clock=VirtualClock()`` so events are stamped with the same virtual time. Sockets
    (the scripted model server, uvicorn) work, in this process, over 127.0.0.1: the kernel delivers a write before
    the loop next looks, so virtual time only jumps when every task waits for a timer.
    """

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_virtual(test(*args, **kwargs))

    return run


async def until(run: Run, condition: Callable[[RunState], bool], what: str, cap: float = 30.0) -> None:
    """Return once ``condition(run.state)`` holds: checked now and after every event ``run`` emits.

    ``cap`` (seconds of the running loop's clock) only bounds a hang: past it, an ``AssertionError`` names ``what``
    and the run's step statuses.
    """
    changed = asyncio.Event()
    run.subscribe(lambda _event: changed.set())  # runs never drop a listener; this one only sets a flag
    try:
        async with asyncio.timeout(cap):
            while not condition(run.state):
                changed.clear()
                await changed.wait()
    except TimeoutError:
        statuses = {sid: record.status for sid, record in run.state.records.items()}
        raise AssertionError(f"run {run.id}: {what} did not happen within {cap:g} s (steps: {statuses})") from None


def step_is(step: str, status: str) -> Callable[[RunState], bool]:
    """A condition for :func:`until`: ``step`` exists and has ``status``."""

    def holds(state: RunState) -> bool:
        record = state.records.get(step)
        return record is not None and record.status == status

    return holds
