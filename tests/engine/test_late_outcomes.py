"""A step whose tool ends in the same loop turn as the run that stops it: the run's decision stands.

The run marks its in-flight steps cancelled when it is stopped (:meth:`Run.fail`, :meth:`Run.cancel`) and cancels
their tasks a turn later; a tool already woken in between (a budget wait that ends refused, an event just set) ends
first. Its late outcome must not move the cancelled step again (the fold refuses that, and the run used to crash
with ``internal error``).
"""

from __future__ import annotations

import asyncio

import pytest

from planweave import Toolbox, VirtualClock, open_engine
from tests.timing import on_virtual_clock, step_is, until


@pytest.mark.parametrize("outcome", ["raises", "returns"])
@on_virtual_clock
async def test_a_tool_that_ends_in_the_turn_its_run_is_stopped_leaves_the_step_cancelled(outcome: str) -> None:
    gate = asyncio.Event()

    async def wait_then_end() -> dict[str, int]:
        """Wait for the gate, then end."""
        await gate.wait()
        if outcome == "raises":
            raise RuntimeError("refused as the run stopped")
        return {"x": 1}

    box = Toolbox()
    box.add(wait_then_end, name="late", idempotent=True)
    async with open_engine("memory://", tools=box, clock=VirtualClock()) as engine:
        run = await engine.start({"steps": [{"id": "a", "tool": "late"}]})
        await until(run, step_is("a", "running"), "step a running")
        gate.set()  # the tool's task is woken first...
        run.fail("stopped by its budget")  # ...then the run stops it, in the same turn
        result = await run.wait()
    assert (result.status, result.error) == ("failed", "stopped by its budget")
    assert result.state.records["a"].status == "cancelled"
