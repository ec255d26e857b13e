"""Loose ends of the planning loop: closing an engine under a planner, a model that cannot be reached, a person's
abort, and counting the ladder's rungs (once, and across a resume)."""

from __future__ import annotations

import asyncio

from planweave import Engine, VirtualClock, run_virtual
from planweave.journal.memory import MemoryJournal


# -- 2. Engine.__aexit__ cancels what Engine.spawn started ---------------------------------------------------------
def test_closing_the_engine_cancels_the_tasks_it_spawned() -> None:
    async def main() -> tuple[bool, bool]:
        forever = asyncio.Event()
        async with asyncio.timeout(5):  # virtual: a hang fails at once instead of after the pytest timeout
            async with Engine(MemoryJournal(), clock=VirtualClock()) as engine:
                task = engine.spawn(forever.wait(), name="waits-forever")
                await asyncio.sleep(0)
        return task.cancelled(), task.done()

    assert run_virtual(main()) == (True, True)
