"""Speculation's fast path (docs/benchmarks.md, "Speculation overhead"): a plan version where no safe step references
a producer has nothing to predict, and the speculator does no per-step work; a new plan version that adds such a
reference is speculated on again. Virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.core.plan.model import SpeculationSpec
from planweave.journal.memory import MemoryJournal

ANY = SpeculationSpec(mode="safe", max_parallel=100, min_confidence=0.0)


def toolbox() -> Toolbox:
    box = builtin_tools()

    async def effect(x: Any) -> Any:
        """Not idempotent."""
        await asyncio.sleep(1)
        return x

    box.add(effect)
    return box


def producers_of(doc: dict[str, Any]) -> tuple[str, ...]:
    async def go() -> tuple[str, ...]:
        async with open_engine(MemoryJournal(), clock=VirtualClock(), tools=toolbox()) as engine:
            run = await engine.start(doc, speculation=ANY)
            await run.wait()
            spec = run.attempts.spec
            assert spec is not None
            return spec._producers

    return run_virtual(go())


def test_only_producers_a_safe_step_references_are_worth_predicting() -> None:
    after_only = {"steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 1}, "predict": None},
                            {"id": "b", "tool": "noop", "after": ["a"]}]}
    assert producers_of(after_only) == ()
    unsafe = {"steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 1, "result": 1}},
                        {"id": "b", "tool": "effect", "args": {"x": "${a}"}}]}
    assert producers_of(unsafe) == ()
    referenced = {"steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 1, "result": 1}},
                            {"id": "b", "tool": "noop", "args": {"x": "${a}"}, "after": ["a"]},
                            {"id": "c", "tool": "noop", "after": ["b"]}]}
    assert producers_of(referenced) == ("a",)


def test_a_step_added_by_a_new_plan_version_is_speculated_on_after_the_fast_path() -> None:
    async def go() -> list[tuple[str, str | None]]:
        journal = MemoryJournal()
        async with open_engine(journal, clock=VirtualClock(), tools=toolbox()) as engine:
            run = await engine.start({"steps": [
                {"id": "a", "tool": "sleep", "args": {"seconds": 5, "result": {"v": 1}}, "predict": {"v": 1}},
                {"id": "z", "tool": "noop", "after": ["a"]}]}, speculation=ANY)
            await asyncio.sleep(1)  # nothing to speculate on yet: the fast path
            run.extend([{"id": "b", "tool": "sleep", "args": {"seconds": 2, "result": "${a.v}"}}])
            result = await run.wait()
            assert result.ok and result.outputs["b"] == 1
            return [(e.kind, e.step) for e in await journal.read(run.id) if e.kind.startswith("speculation_")]

    assert run_virtual(go()) == [("speculation_started", "b"), ("speculation_adopted", "b")]
