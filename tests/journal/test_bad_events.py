"""One event that cannot be stored must not poison the journal: the engine and the journal together, on SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planweave import builtin_tools, open_engine
from planweave.core.errors import EventNotRecorded, PlanInvalid
from planweave.core.plan.model import PlanSpec, Step
from planweave.journal import open_journal
from planweave.tools.registry import Toolbox

SURROGATE_PLAN = {"steps": [{"id": "a", "tool": "noop", "args": {"x": "\ud800"}}]}
GOOD_PLAN = {"steps": [{"id": "a", "tool": "noop"}]}


def _tools(seen: list[str]) -> Toolbox:
    box = builtin_tools()

    async def grumpy(text: str) -> str:
        """Fail with a message holding a lone surrogate (as decoded from a bad file name or a JSON escape)."""
        seen.append(text)
        raise ValueError(f"cannot read {text}\udc80 here")

    async def garbled() -> dict[str, Any]:
        """Return an output with a lone surrogate inside."""
        return {"name": ["ok", "bad \udcff"]}

    box.add(grumpy, idempotent=True)
    box.add(garbled, idempotent=True)
    return box


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


async def test_a_plan_the_journal_cannot_record_is_not_started_and_the_next_run_works(url: str) -> None:
    async with open_engine(url) as engine:
        # Plan validation may refuse it first (PlanInvalid); either way nothing is journaled.
        with pytest.raises((EventNotRecorded, PlanInvalid), match="surrogate"):
            await engine.start(SURROGATE_PLAN, run_id="bad")
        result = await (await engine.start(GOOD_PLAN, run_id="good")).wait()
    assert result.status == "succeeded"
    async with open_journal(url) as journal:
        assert await journal.run_ids() == ["good"]


@pytest.mark.parametrize(("value", "problem"), [
    ([1, object()], "plan.steps[0].args.x[1] is a object: not JSON-serialisable"),
    ("\ud800", "plan.steps[0].args.x holds a lone surrogate (\\ud800): not valid UTF-8"),
])
async def test_the_journal_guard_refuses_what_plan_validation_let_through(url: str, value: Any, problem: str) -> None:
    # A PlanSpec built in Python skips the document checks of plan files: the journal is the second line.
    odd = PlanSpec(steps=(Step(id="a", tool="noop", args={"x": value}),))
    async with open_engine(url) as engine:
        with pytest.raises(EventNotRecorded) as info:
            await engine.start(odd, run_id="odd")
        assert engine._runs == {}
        result = await (await engine.start(GOOD_PLAN, run_id="good")).wait()
    message = str(info.value)
    assert "run 'odd' was not started" in message
    assert problem in message
    assert result.status == "succeeded"
    async with open_journal(url) as journal:
        assert await journal.run_ids() == ["good"]
        assert await journal.read("odd") == []


async def test_a_tool_error_with_a_lone_surrogate_is_recorded_with_a_replacement_character(url: str) -> None:
    seen: list[str] = []
    plan = {"steps": [{"id": "g", "tool": "grumpy", "args": {"text": "file"}, "retries": 0}]}
    async with open_engine(url, tools=_tools(seen)) as engine:
        failed = await (await engine.start(plan, run_id="grumpy")).wait()
        after = await (await engine.start(GOOD_PLAN, run_id="after")).wait()
    assert seen == ["file"]
    assert failed.status == "failed"
    assert after.status == "succeeded"
    async with open_journal(url) as journal:
        (event,) = await journal.read("grumpy", kind="step_failed")
        assert event.data["error"] == "ValueError: cannot read file\ufffd here"
        assert [e.kind for e in await journal.read("grumpy")][-1] == "run_finished"
        assert await journal.run_ids() == ["grumpy", "after"]


async def test_an_output_with_a_lone_surrogate_fails_its_step_with_kind_output(url: str) -> None:
    plan = {"steps": [{"id": "o", "tool": "garbled"}]}
    async with open_engine(url, tools=_tools([])) as engine:
        result = await (await engine.start(plan, run_id="garbled")).wait()
    assert result.status == "failed"
    step = result.summary["steps"]["o"]
    assert step["status"] == "failed"
    async with open_journal(url) as journal:
        (event,) = await journal.read("garbled", kind="step_failed")
    assert event.data["kind"] == "output"
    assert event.data["error"] == "output of step 'o' at name[1] holds a lone surrogate (\\udcff): not valid UTF-8"
