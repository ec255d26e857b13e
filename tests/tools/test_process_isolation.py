"""``isolation: process``: a sync tool runs in a worker process, killed at its step's timeout or cancellation."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from planweave import Event, RunResult, Toolbox, builtin_tools, open_engine
from tests.tools import process_tools

SPAWN_S = 5.0  # generous bound on starting a spawned interpreter on a loaded machine


def tools() -> Toolbox:
    box = builtin_tools()
    for fn in (process_tools.stuck, process_tools.whoami, process_tools.fails, process_tools.exits,
               process_tools.dies, process_tools.unsendable):
        box.add(fn)

    def local_function() -> str:
        return "a closure cannot be pickled by reference"

    box.add(local_function)
    return box


async def run(steps: list[dict[str, Any]], cancel_after: str | None = None) -> tuple[RunResult, list[Event]]:
    async with open_engine("memory://", tools=tools()) as engine:
        started = await engine.start({"on_failure": "continue", "steps": steps})
        if cancel_after is not None:
            # Polling on purpose: the worker is another process; it writes the file once it runs.
            while not Path(cancel_after).exists():  # noqa: ASYNC110, ASYNC240 (a stat; see above)
                await asyncio.sleep(0.02)
            started.cancel()
        result = await started.wait()
        return result, list(await engine.journal.read(started.id))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def failures(events: list[Event]) -> dict[str, tuple[str, str]]:
    return {e.step or "": (e.data["kind"], e.data["error"]) for e in events if e.kind == "step_failed"}


async def test_a_stuck_process_isolated_step_is_killed_at_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    began = time.monotonic()
    # 3 s: time for the spawned worker to start and write its pid, also on a loaded machine
    _, events = await run([{"id": "stuck", "tool": "stuck", "isolation": "process", "timeout": 3,
                            "args": {"seconds": 60, "pidfile": str(pidfile)}}])
    took = time.monotonic() - began
    assert failures(events) == {"stuck": ("timeout", "timed out after 3s")}
    pid = int(pidfile.read_text())
    assert pid != os.getpid()
    assert not alive(pid)  # terminated and reaped: not even a zombie is left
    assert took < 3 + SPAWN_S


async def test_cancelling_the_run_kills_the_worker(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    result, _ = await run([{"id": "stuck", "tool": "stuck", "isolation": "process",
                            "args": {"seconds": 60, "pidfile": str(pidfile)}}], cancel_after=str(pidfile))
    assert result.status == "cancelled"
    assert not alive(int(pidfile.read_text()))


async def test_the_result_comes_back_from_the_worker_and_errors_keep_their_kind() -> None:
    result, events = await run([
        {"id": "isolated", "tool": "whoami", "isolation": "process", "args": {"tag": "x"}},
        {"id": "threaded", "tool": "whoami", "isolation": "thread", "args": {"tag": "y"}},
        {"id": "raises", "tool": "fails", "isolation": "process", "args": {"message": "no luck"}},
        {"id": "exits", "tool": "exits", "isolation": "process"},
        {"id": "dies", "tool": "dies", "isolation": "process"},
        {"id": "unsendable", "tool": "unsendable", "isolation": "process"},
    ])
    assert result.outputs["isolated"]["tag"] == "x" and result.outputs["isolated"]["pid"] != os.getpid()
    assert result.outputs["threaded"]["pid"] == os.getpid()
    failed = failures(events)
    assert failed["raises"] == ("ValueError", "ValueError: no luck")
    assert failed["exits"][0] == "exit"
    assert failed["dies"][0] == "crashed" and "exit code 9" in failed["dies"][1]
    assert failed["unsendable"][0] == "output" and "cannot be pickled" in failed["unsendable"][1]


@pytest.mark.parametrize(("tool", "says"), [
    ("local_function", "importable by module and name"),
    ("noop", "synchronous Python functions only; tool 'noop' is async"),
])
async def test_a_tool_that_cannot_run_in_a_process_fails_saying_why(tool: str, says: str) -> None:
    _, events = await run([{"id": "s", "tool": tool, "isolation": "process"}])
    kind, error = failures(events)["s"]
    assert kind == "arguments"
    assert says in error and f"'{tool}'" in error
