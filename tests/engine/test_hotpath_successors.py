"""A step made ready by an attempt's success may run next in that attempt's task (no task of its own).

What must hold: the tool's ``asyncio.current_task()`` is the task the run cancels to cancel its step; a run of
successors gives the loop back after a few steps (other runs and timers get their turn); cancelling a step that
runs in such a task cancels that step alone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from planweave import Engine, Run, Toolbox, VirtualClock, current_step, run_virtual
from planweave.journal.memory import MemoryJournal


def _chain(n: int, tool: str = "mark") -> dict[str, Any]:
    return {"steps": [{"id": f"s{i}", "tool": tool, **({"after": [f"s{i - 1}"]} if i else {})} for i in range(n)]}


def test_each_tool_runs_in_the_task_its_run_holds_for_its_step_and_a_task_runs_few_steps() -> None:
    seen: list[tuple[str, str | None, asyncio.Task[Any] | None]] = []

    async def mark() -> dict[str, Any]:
        """Record the step, the step the run maps this task to, and the task."""
        task = asyncio.current_task()
        step = current_step()
        assert isinstance(step.sink, Run)
        seen.append((step.step_id, step.sink.step_of(task), task))
        return {}

    box = Toolbox()
    box.add(mark, name="mark", idempotent=True)

    async def go() -> str:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(_chain(40))
            return (await run.wait()).status

    assert run_virtual(go()) == "succeeded"
    assert [s for s, _, _ in seen] == [f"s{i}" for i in range(40)]
    assert all(step == mapped for step, mapped, _ in seen)  # cancelling the step cancels this very task
    per_task = Counter(id(task) for _, _, task in seen)
    assert max(per_task.values()) <= 9  # the first attempt and 8 successors at most, then a task of its own


def test_a_chain_of_successors_gives_the_loop_back() -> None:
    order: list[str] = []

    async def mark() -> dict[str, Any]:
        """Record the step."""
        order.append(current_step().step_id)
        return {}

    box = Toolbox()
    box.add(mark, name="mark", idempotent=True)

    async def go() -> None:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(_chain(60))
            asyncio.get_running_loop().call_soon(order.append, "timer")
            await run.wait()

    run_virtual(go())
    assert "timer" in order
    assert order.index("timer") < order.index("s59")  # not after a 60-step chain ran without a loop turn


def test_cancelling_a_step_running_as_a_successor_cancels_it_alone() -> None:
    finished: list[str] = []

    async def quick() -> dict[str, Any]:
        """Return at once."""
        return {}

    async def slow() -> dict[str, Any]:
        """Take 100 seconds."""
        await asyncio.sleep(100)
        finished.append(current_step().step_id)
        return {}

    box = Toolbox()
    box.add(quick, name="quick", idempotent=True)
    box.add(slow, name="slow", idempotent=True)

    async def go() -> tuple[dict[str, str], float]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=box) as engine:
            run = await engine.start({"steps": [
                {"id": "a", "tool": "quick"},
                {"id": "b", "tool": "slow", "after": ["a"]},  # runs in a's task
                {"id": "c", "tool": "quick", "after": ["a"]},
                {"id": "d", "tool": "slow", "after": ["c"]},  # runs in c's task
            ]}, on_failure="continue")
            await asyncio.sleep(1)
            assert run.cancel_step("b", "not needed")
            result = await run.wait()
            return ({sid: r.status for sid, r in result.state.records.items()},
                    asyncio.get_running_loop().time())

    statuses, ended = run_virtual(go())
    assert statuses == {"a": "succeeded", "b": "cancelled", "c": "succeeded", "d": "succeeded"}
    assert finished == ["d"]  # b's tool was stopped, d's ran to its end
    assert ended == 100.0
