"""A run keeps its step attempts' tasks itself (not in its TaskGroup): it still ends only once every attempt has.

Each test has a tool that, cancelled, takes 5 (virtual) seconds to clean up. A run that forgot the task of an
attempt would end, or let its engine close, while that tool is still cleaning up.
"""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import Engine, Toolbox, VirtualClock, run_virtual
from planweave.core.events import Event
from planweave.journal.memory import MemoryJournal


class SlowToStop:
    """A tool that waits until cancelled, then cleans up for 5 seconds; records when it started and ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.ended_at: float | None = None

    def toolbox(self) -> Toolbox:
        async def slow_to_stop() -> None:
            """Wait; cancelled, clean up for 5 seconds."""
            self.started.set()
            try:
                await asyncio.sleep(1000)
            except asyncio.CancelledError:
                await asyncio.sleep(5)
                self.ended_at = asyncio.get_running_loop().time()
                raise

        box = Toolbox()
        box.add(slow_to_stop, name="slow", idempotent=True)
        box.add(_quick, name="quick", idempotent=True)
        return box


async def _quick() -> dict[str, Any]:
    """Return at once."""
    return {}


def test_a_cancelled_run_ends_after_its_attempts_have() -> None:
    tool = SlowToStop()

    async def go() -> tuple[str, float | None, float]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=tool.toolbox()) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "slow"}]})
            await tool.started.wait()
            run.cancel("enough")
            result = await run.wait()
            return result.status, tool.ended_at, asyncio.get_running_loop().time()

    status, ended_at, finished_at = run_virtual(go())
    assert status == "cancelled"
    assert ended_at == 5.0  # the attempt's cleanup ran to its end...
    assert finished_at >= 5.0  # ...before the run's result


def test_a_run_waits_for_the_attempt_of_a_step_it_cancelled_alone() -> None:
    tool = SlowToStop()

    async def go() -> tuple[str, float | None, float]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=tool.toolbox()) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "slow"}, {"id": "b", "tool": "quick"}]},
                                     on_failure="continue")
            await tool.started.wait()
            assert run.cancel_step("a", "not needed")  # nothing else is active: the run may end now
            result = await run.wait()
            return result.state.records["a"].status, tool.ended_at, asyncio.get_running_loop().time()

    status, ended_at, finished_at = run_virtual(go())
    assert status == "cancelled"
    assert ended_at == 5.0
    assert finished_at >= 5.0


def test_the_engine_closes_after_the_attempts_of_its_interrupted_runs_have_ended() -> None:
    tool = SlowToStop()

    async def go() -> tuple[float | None, float, list[asyncio.Task[Any]]]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=tool.toolbox()) as engine:
            await engine.start({"steps": [{"id": "a", "tool": "slow"}]})
            await tool.started.wait()
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return tool.ended_at, asyncio.get_running_loop().time(), left

    ended_at, closed_at, left = run_virtual(go())
    assert ended_at == 5.0
    assert closed_at >= 5.0
    assert left == []  # no attempt task outlives the engine


def test_an_error_in_an_attempts_bookkeeping_ends_the_run_failed() -> None:
    # What the run's TaskGroup did for a task of its own that raised: the run ends, visibly, instead of hanging.
    def listener(event: Event) -> None:
        if event.kind == "step_succeeded":
            raise ValueError("a listener's bug")

    async def go() -> tuple[str, str | None]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=SlowToStop().toolbox()) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "quick"}]}, on_event=listener)
            result = await asyncio.wait_for(run.wait(), 60)
            return result.status, result.error

    status, error = run_virtual(go())
    assert status == "failed"
    assert error == "internal error: ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)"
