"""The engine keeps the garbage collector off many runs' long-lived state: freezes every N started runs, thaws
after a few freezes and when no run is left; nothing stays alive because of it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from planweave import Engine, VirtualClock, builtin_tools, run_virtual
from planweave.engine.collector import CollectorPolicy
from planweave.journal.memory import MemoryJournal


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


class Cycle:
    """Garbage only the cyclic collector frees (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


def test_the_policy_freezes_every_n_runs_and_thaws_after_a_few_freezes() -> None:
    policy = CollectorPolicy(freeze_every=3, thaw_after=2)
    seen = []
    for _ in range(9):
        policy.run_started()
        seen.append(gc.get_freeze_count() > 0)
    # freezes at the 3rd and 6th run, thaws at the 9th
    assert seen == [False, False, True, True, True, True, True, True, False]
    assert (policy.frozen, policy.thaws) == (0, 1)


def test_cyclic_garbage_frozen_with_the_heap_is_freed_when_the_engine_goes_idle() -> None:
    gc.collect()
    cycle = Cycle()
    ref = weakref.ref(cycle)

    async def go() -> tuple[bool, bool, int]:
        box = builtin_tools()
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=box, gc_freeze_every=2) as engine:
            first = await engine.start({"steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 1}}]})
            second = await engine.start({"steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 2}}]})
            frozen = gc.get_freeze_count() > 0  # the second start froze the heap, the cycle with it
            nonlocal cycle
            del cycle  # now garbage, but frozen: no collection sees it
            await first.wait()
            gc.collect()
            kept_while_busy = ref() is not None
            await second.wait()  # no run left: thawed and collected
            return frozen, kept_while_busy, gc.get_freeze_count()

    frozen, kept_while_busy, left_frozen = run_virtual(go())
    assert frozen and kept_while_busy
    assert left_frozen == 0 and ref() is None


def test_an_engine_told_never_to_freeze_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))

    async def go() -> Any:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=builtin_tools(),
                          gc_freeze_every=None) as engine:
            for _ in range(5):
                await (await engine.start({"steps": [{"id": "a", "tool": "noop"}]})).wait()

    run_virtual(go())
    assert calls == []
    with pytest.raises(ValueError, match="gc_freeze_every must be at least 1"):
        CollectorPolicy(0)


def test_a_run_of_at_least_freeze_every_steps_freezes_at_its_start_and_thaws_when_it_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    steps = [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": 1}} for i in range(3)]

    async def go() -> tuple[int, int, int]:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=builtin_tools(), gc_freeze_every=3) as engine:
            small = await engine.start({"steps": steps[:2]})  # fewer steps than gc_freeze_every: no freeze
            while_small = gc.get_freeze_count()
            await small.wait()
            big = await engine.start({"steps": steps})  # the second run only, but of 3 steps: frozen at once
            while_big = gc.get_freeze_count()
            await big.wait()  # no run left: thawed (and collected)
            return while_small, while_big, gc.get_freeze_count()

    collected: list[int] = []

    def collect(generation: int = 2) -> int:
        collected.append(generation)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    while_small, while_big, after = run_virtual(go())
    assert while_small == 0
    assert while_big > 0
    assert after == 0
    assert collected == []  # after big runs only, thawed without a collection of its own for the run to pay
