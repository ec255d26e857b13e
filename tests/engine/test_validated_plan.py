"""A plan validated once starts many runs without being checked again, and only against what it was checked with.

``Engine.start`` takes a :class:`Plan` as it is when ``validate_plan`` checked it against the engine's capacities and
the very tool objects the catalog holds now (``Plan.checked_against``); any other plan is validated as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from planweave import PlanInvalid, Toolbox, VirtualClock, open_engine, run_virtual, validate_plan
from planweave.core.events import Event
from planweave.core.plan.graph import parse_plan_document
from planweave.tools.registry import Tool

CHECKS: list[str] = []  # every check_args call of a CountingTool, by tool name (read after the runs)


class CountingTool(Tool):
    """A tool that records each time its arguments are checked (as validation does, once per step naming it)."""

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        CHECKS.append(self.name)
        return super().check_args(args, deferred)


async def echo(text: str) -> dict[str, Any]:
    return {"text": text}


async def strict(text: int) -> dict[str, Any]:  # the same name as echo in another toolbox: text must be a number
    return {"text": text}


def _box(fn: Any, *, idempotent: bool = False) -> Toolbox:
    base = Tool.from_function(fn, name="echo", idempotent=idempotent)
    return Toolbox({"echo": CountingTool(**{f: getattr(base, f) for f in base.__dataclass_fields__})})


DOC = {"steps": [{"id": "a", "tool": "echo", "args": {"text": "hi"}},
                 {"id": "b", "tool": "echo", "args": {"text": "${a.text}"}}]}


def test_a_plan_checked_against_the_engines_tools_is_not_checked_again_run_after_run() -> None:
    box = _box(echo)

    async def go() -> list[str]:
        async with open_engine("memory://", clock=VirtualClock(), tools=box) as engine:
            plan = validate_plan(parse_plan_document(DOC), box, engine.capacities)
            checked_once = len(CHECKS)
            statuses: list[str] = [(await (await engine.start(plan)).wait()).status for _ in range(3)]
            assert len(CHECKS) == checked_once  # three runs, no check of the arguments again
            await (await engine.start(plan.spec)).wait()  # a spec is validated, as always
            assert len(CHECKS) > checked_once
            return statuses

    CHECKS.clear()
    assert run_virtual(go()) == ["succeeded"] * 3


def test_another_tool_under_the_same_name_checks_the_plan_again_and_refuses_it() -> None:
    plan = validate_plan(parse_plan_document(DOC), _box(echo), {})

    async def go() -> None:
        async with open_engine("memory://", clock=VirtualClock(), tools=_box(strict)) as engine:
            await engine.start(plan)

    with pytest.raises(PlanInvalid, match="step 'a'"):
        run_virtual(go())


def test_other_capacities_check_the_plan_again() -> None:
    doc = {"capacities": {"gpu": 2}, "steps": [{"id": "a", "tool": "echo", "args": {"text": "x"},
                                                 "resources": {"gpu": 2}}]}
    box = _box(echo)
    plan = validate_plan(parse_plan_document(doc), box, {"gpu": 2})
    assert plan.checked_against(box, {"gpu": 2})
    assert not plan.checked_against(box, {"gpu": 1})

    async def go() -> None:
        async with open_engine("memory://", clock=VirtualClock(), tools=box, capacities={"gpu": 1}) as engine:
            await engine.start(plan)

    with pytest.raises(PlanInvalid, match="gpu"):
        run_virtual(go())


def test_a_plan_checked_without_tools_or_capacities_is_checked_at_start() -> None:
    box = _box(echo)
    unchecked = validate_plan(parse_plan_document(DOC))  # no tools: their checks did not run
    assert not unchecked.checked_against(box, {})
    CHECKS.clear()

    async def go() -> str:
        async with open_engine("memory://", clock=VirtualClock(), tools=box) as engine:
            return (await (await engine.start(unchecked)).wait()).status

    assert run_virtual(go()) == "succeeded"
    assert CHECKS  # checked at start


def test_the_journaled_idempotent_steps_follow_the_tools_the_run_is_given() -> None:
    safe, unsafe = _box(echo, idempotent=True), _box(echo)
    plan = validate_plan(parse_plan_document(DOC), safe, {})

    async def idempotent(tools: Toolbox) -> list[list[str]]:
        async with open_engine("memory://", clock=VirtualClock(), tools=safe) as engine:
            out = []
            for _ in range(2):  # the second run of the same plan takes the list kept on it
                run = await engine.start(plan, tools=tools)
                await run.wait()
                events: list[Event] = await engine.journal.read(run.id)
                out.append(list(events[0].data["idempotent"]))
            return out

    assert run_virtual(idempotent(safe)) == [["a", "b"], ["a", "b"]]
    assert run_virtual(idempotent(unsafe)) == [[], []]
