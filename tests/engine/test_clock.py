"""The virtual clock: time jumps to the next timer, so years pass in milliseconds, deterministically."""

from __future__ import annotations

import asyncio
import time

import pytest

from planweave import VirtualClock, run_virtual
from tests.engine.conftest import run_plan

YEAR = 365 * 24 * 3600.0


def test_sleeping_years_takes_milliseconds() -> None:
    async def go() -> float:
        await asyncio.sleep(3 * YEAR)
        return VirtualClock().now()

    wall = time.perf_counter()
    assert run_virtual(go()) == 3 * YEAR
    assert time.perf_counter() - wall < 1.0


def test_timeouts_run_on_virtual_time() -> None:
    async def go() -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.sleep(100)
        return asyncio.get_running_loop().time()

    assert run_virtual(go()) == 10.0


def test_concurrent_sleepers_overlap() -> None:
    async def go() -> float:
        await asyncio.gather(*(asyncio.sleep(d) for d in (5, 3, 8, 1)))
        return asyncio.get_running_loop().time()

    assert run_virtual(go()) == 8.0


def test_threads_still_complete_on_a_virtual_loop() -> None:
    async def go() -> int:
        return await asyncio.to_thread(lambda: 41 + 1)

    assert run_virtual(go()) == 42


def test_virtual_clock_outside_its_loop_is_an_error() -> None:
    async def go() -> None:
        VirtualClock().now()

    with pytest.raises(RuntimeError, match="run_virtual"):
        asyncio.run(go())


def test_a_plan_of_years_is_exact() -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": YEAR}},
        {"id": "b", "tool": "sleep", "args": {"seconds": 2 * YEAR}, "after": ["a"]},
        {"id": "c", "tool": "sleep", "args": {"seconds": 0.5 * YEAR}, "after": ["a"]},
    ]})
    assert result.summary["makespan_s"] == 3 * YEAR
