"""Sync tool calls run in planweave's daemon threads: they keep context variables and never hold the process."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from planweave.tools.isolation import ToolThreads, run_in_thread

who: contextvars.ContextVar[str] = contextvars.ContextVar("who")


def describe() -> tuple[str, bool, str]:
    thread = threading.current_thread()
    return who.get(), thread.daemon, thread.name


def test_a_sync_call_runs_in_a_daemon_thread_with_the_callers_context() -> None:
    async def main() -> tuple[str, bool, str]:
        who.set("step a")
        return await run_in_thread(describe)

    seen, daemon, name = asyncio.run(main())
    assert (seen, daemon) == ("step a", True)
    assert name.startswith("planweave-tool")


def test_a_cancelled_wait_ends_at_once_while_the_call_runs_on() -> None:
    release = threading.Event()

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await run_in_thread(release.wait, timeout=10)
        return time.monotonic() - started

    waited = asyncio.run(main())
    release.set()
    assert waited < 1.0


def test_workers_are_reused_and_bounded() -> None:
    pool = ToolThreads(max_workers=2, name="bounded")
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 10) for _ in range(5)]
    assert pool.workers == 2  # the other three wait for a free worker
    gate.set()
    assert [f.result(timeout=10) for f in futures] == [True] * 5
    later = pool.submit(threading.current_thread)
    assert later.result(timeout=10).name.startswith("bounded")
    assert pool.workers == 2


def test_shutdown_does_not_wait_for_a_running_call_and_refuses_new_ones() -> None:
    pool = ToolThreads(name="closing")
    gate = threading.Event()
    running = pool.submit(gate.wait, 10)
    started = time.monotonic()
    pool.shutdown(wait=True)
    assert time.monotonic() - started < 1.0
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)
    gate.set()
    assert running.result(timeout=10) is True


def test_a_base_exception_in_a_call_reaches_the_caller() -> None:
    pool = ToolThreads(name="raising")
    with pytest.raises(SystemExit):
        pool.submit(exit_now).result(timeout=10)


def exit_now() -> None:
    raise SystemExit(2)
