"""An async tool that blocks the event loop is named in a warning (logged, and journaled for its step)."""

from __future__ import annotations

import logging
import time

import pytest

from planweave import Event, RunResult, Toolbox, builtin_tools, open_engine
from planweave.engine.loopwatch import LOOP_STALL_S

BLOCK_S = 1.5


async def hog(seconds: float) -> str:
    """An async tool that wrongly blocks the loop."""
    time.sleep(seconds)  # noqa: ASYNC251 (the point of the test)
    return "done"


def polite(seconds: float) -> str:
    """A sync tool: it blocks a worker thread, never the loop."""
    time.sleep(seconds)
    return "done"


def tools() -> Toolbox:
    box = builtin_tools()
    box.add(hog)
    box.add(polite)
    return box


async def run(tool: str, timeout: float | None = 0.5) -> tuple[RunResult, list[Event]]:
    async with open_engine("memory://", tools=tools()) as engine:
        started = await engine.start({"steps": [
            {"id": "blocker", "tool": tool, "args": {"seconds": BLOCK_S}, "timeout": timeout},
        ]})
        result = await started.wait()
        return result, list(await engine.journal.read(started.id))


# Without a timeout the tool's coroutine is awaited by the attempt itself, with one a frame of the engine sits
# between them: either way the innermost frame is the tool's.
@pytest.mark.parametrize("timeout", [0.5, None])
async def test_a_tool_blocking_the_event_loop_is_named_in_a_warning(caplog: pytest.LogCaptureFixture,
                                                                    timeout: float | None) -> None:
    with caplog.at_level(logging.WARNING, logger="planweave.engine"):
        result, events = await run("hog", timeout)
    logged = [r.getMessage() for r in caplog.records if r.name == "planweave.engine"]
    assert len(logged) == 1, logged
    assert "step 'blocker' (tool 'hog')" in logged[0] and "blocked the event loop" in logged[0]
    assert "test_loop_watch.py" in logged[0]  # where it blocked
    warnings = [e for e in events if e.kind == "warning"]
    assert [(e.step, e.data["tool"]) for e in warnings] == [("blocker", "hog")]
    assert LOOP_STALL_S <= warnings[0].data["blocked_s"] <= BLOCK_S + 1.0
    assert result.status == "succeeded"  # its timeout could not fire while it blocked: hence the warning


async def test_a_sync_tool_blocking_its_thread_raises_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="planweave.engine"):
        result, events = await run("polite")
    assert [r for r in caplog.records if r.name == "planweave.engine"] == []
    assert [e for e in events if e.kind == "warning"] == []
    assert result.status == "failed"  # it ran in a thread: its timeout fired on time
    assert result.state.records["blocker"].error is not None and "timed out" in result.state.records["blocker"].error
