"""Shared helpers for engine tests: a recording toolbox and a virtual-clock runner."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from planweave import RunResult, Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual

T = TypeVar("T")


@dataclass
class Recorder:
    """Tools that record when each call started and ended (on the engine's clock).

    ``starts`` and ``successes`` keep every call, so a test can see work that ran twice; ``ends`` is the time of the
    latest success, for tests that only need one figure per step.
    """

    starts: dict[str, list[float]] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)
    successes: dict[str, list[float]] = field(default_factory=dict)
    running: int = 0
    peak: int = 0
    calls: list[str] = field(default_factory=list)

    def toolbox(self) -> Toolbox:
        box = builtin_tools()
        rec = self

        async def work(name: str, seconds: float = 0.0, fail_times: int = 0, result: Any = None) -> Any:
            """Sleep `seconds`, failing the first `fail_times` attempts."""
            loop = asyncio.get_running_loop()
            rec.starts.setdefault(name, []).append(loop.time())
            rec.calls.append(name)
            rec.running += 1
            rec.peak = max(rec.peak, rec.running)
            try:
                await asyncio.sleep(seconds)
                if len(rec.starts[name]) <= fail_times:
                    raise ConnectionError(f"{name} flaked")
            finally:
                rec.running -= 1
            rec.ends[name] = loop.time()
            rec.successes.setdefault(name, []).append(rec.ends[name])
            return {"name": name} if result is None else result

        box.add(work, idempotent=True)
        return box


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def virtual(fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async function on the virtual clock."""

    async def main() -> T:
        return await fn()

    return run_virtual(main())


def run_plan(
    doc: Mapping[str, Any],
    tools: Toolbox | None = None,
    *,
    concurrency: int | None = None,
    capacities: Mapping[str, int] | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Run one plan to completion on the virtual clock with an in-memory journal."""

    async def go() -> RunResult:
        async with open_engine(
            "memory://", clock=VirtualClock(), concurrency=concurrency, capacities=capacities, tools=tools
        ) as engine:
            run = await engine.start(doc, run_id=run_id)
            return await run.wait()

    return virtual(go)
