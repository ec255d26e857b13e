"""The run's record of each step's in-flight attempt: what cancels it when the plan changes or the run stops."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import Engine, VirtualClock, run_virtual
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import Recorder


def test_a_fallback_launched_by_a_failed_attempt_is_cancelled_when_a_new_version_drops_its_step(
    recorder: Recorder,
) -> None:
    # The failing attempt launches the fallback from its own except block, so its cleanup runs after the
    # fallback's task is registered under the same step id: it must leave that entry alone.
    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start({"steps": [
                {"id": "a", "tool": "work", "args": {"name": "a", "fail_times": 1}, "retries": 0,
                 "fallback": {"tool": "work", "args": {"name": "fb", "seconds": 100}}},
            ]}, hold=True)
            await asyncio.sleep(1)  # 'a' failed at 0; its fallback runs until 100
            diff = run.propose({"steps": [{"id": "other", "tool": "work", "args": {"name": "other", "seconds": 1}}]})
            run.release()
            result = await run.wait()
            return diff, result, asyncio.get_running_loop().time()

    diff, result, ended = run_virtual(go())
    assert diff.cancelled == ("a",)
    assert recorder.starts["fb"] == [0.0]
    assert "fb" not in recorder.ends  # cancelled, not left running to its end
    assert ended < 100
    assert result.state.records["other"].status == "succeeded"
