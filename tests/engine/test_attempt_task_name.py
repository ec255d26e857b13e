"""An attempt's task is named by its step (a debugger, a stack dump or ``asyncio.all_tasks()`` says which step)."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual


def test_an_attempts_task_is_named_by_its_step() -> None:
    seen: dict[str, str] = {}  # recorded in the tool, asserted after the run

    async def whoami(label: str) -> dict[str, Any]:
        task = asyncio.current_task()
        seen[label] = task.get_name() if task is not None else "<no task>"
        return {}

    async def go() -> str:
        box = builtin_tools()
        box.add(whoami)
        async with open_engine("memory://", clock=VirtualClock(), tools=box) as engine:
            run = await engine.start({"steps": [
                {"id": "first", "tool": "whoami", "args": {"label": "first"}},
                {"id": "second", "tool": "whoami", "args": {"label": "second"}, "after": ["first"]},
            ]})
            return (await run.wait()).status

    assert run_virtual(go()) == "succeeded"
    assert seen == {"first": "first", "second": "second"}


def test_a_task_factory_on_the_loop_builds_the_attempts_tasks() -> None:
    made: list[asyncio.Task[Any]] = []  # the tasks the factory built (named after it returns), read after the run

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    async def go() -> str:
        asyncio.get_running_loop().set_task_factory(factory)
        async with open_engine("memory://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await engine.start({"steps": [{"id": "one", "tool": "noop"}, {"id": "two", "tool": "noop"}]})
            return (await run.wait()).status

    assert run_virtual(go()) == "succeeded"
    assert {"one", "two"} <= {task.get_name() for task in made}
