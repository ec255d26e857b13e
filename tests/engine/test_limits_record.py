"""A run's limits are a typed record (``LimitsRecord``), journaled as the JSON object journals have always held and
read back field by field; a journal written by an older version (the open dict of before) still resumes."""

from __future__ import annotations

import asyncio
from typing import Any

from planweave import Engine, VirtualClock, run_virtual
from planweave.core.events import Event
from planweave.journal.memory import MemoryJournal
from planweave.limits import JournaledLimits, LimitsRecord, RunLimits
from tests.engine.conftest import Recorder

SLOW = {"steps": [{"id": "a", "tool": "work", "args": {"name": "a", "seconds": 5}}]}

# options.limits of a --goal run with --cascade, --deadline-pressure and an endpoint, as the open dict of before
# (RunLimits.journaled(now, model, **extra)) wrote it: the four limits, deadline_at and model, then the extras given.
OLD_FULL: dict[str, Any] = {
    "budget_usd": 0.5, "budget_tokens": 1000, "deadline": 60, "max_replans": 3, "deadline_at": 1060.0,
    "model": "gpt-4o-mini", "pressure": 0.8, "parent": {"run": "p", "step": "s", "depth": 1}, "origin": "POST /runs",
    "base_url": "http://127.0.0.1:9/v1", "api_key_env": "MY_KEY", "header_names": ["X-Team"],
    "tiers": {"small": {"model": "m-small"}}, "cascade": True, "planner": "auto", "context": "summary",
    "subplans": False,
}


def test_a_record_is_journaled_in_the_shape_journals_hold_and_read_back_whole() -> None:
    record = RunLimits(0.5, 1000, 60, 3).journaled(
        1000.0, "gpt-4o-mini", pressure=0.8, parent={"run": "p", "step": "s", "depth": 1}, origin="POST /runs",
        base_url="http://127.0.0.1:9/v1", api_key_env="MY_KEY", header_names=["X-Team"],
        tiers={"small": {"model": "m-small"}}, cascade=True, planner="auto", context="summary", subplans=False)
    assert record.to_json() == OLD_FULL
    assert LimitsRecord.from_json(record.to_json()) == record
    assert record.deadline_at == 1060.0 and record.limits.budget_tokens == 1000 and record.header_names == ("X-Team",)
    # Left out: not journaled (as before, a key given None was dropped), and read back as not given.
    plain = RunLimits().journaled(5.0)
    assert plain.to_json() == {"budget_usd": None, "budget_tokens": None, "deadline": None, "max_replans": None,
                               "deadline_at": None, "model": None}
    assert LimitsRecord.from_json(plain.to_json()) == plain == LimitsRecord()


def test_an_older_or_odd_record_reads_as_far_as_it_goes() -> None:
    # Before context, sub-plans and endpoints were journaled; a count written as a float; a field of another type.
    old = LimitsRecord.from_json({"budget_usd": 1, "budget_tokens": 500.0, "deadline": None, "max_replans": 2,
                                  "deadline_at": "soon", "model": "m", "pressure": True, "unknown": "kept out"})
    assert old.limits == RunLimits(1, 500, None, 2) and isinstance(old.limits.budget_tokens, int)
    assert old.deadline_at is None and old.pressure is None and old.model == "m"
    assert old.context is None and old.subplans is None and old.cascade is False and old.tiers is None


def _copy(events: list[Event], limits: dict[str, Any] | None) -> MemoryJournal:
    """A journal holding ``events``, its ``run_created`` with ``options.limits`` as an older version wrote it."""
    journal = MemoryJournal("memory://")
    for event in events:
        data = event.data
        if event.kind == "run_created":
            options = {k: v for k, v in data["options"].items() if k != "limits"}
            data = {**data, "options": {**options, **({} if limits is None else {"limits": limits})}}
        journal.append(Event(event.run_id, event.kind, event.at, event.step, data))
    return journal


def test_a_run_journaled_with_the_old_dict_resumes_with_its_limits(recorder: Recorder) -> None:
    async def interrupted() -> list[Event]:
        journal = MemoryJournal("memory://")
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            await engine.start(SLOW, run_id="r", limits=RunLimits(deadline=60).journaled(engine.clock.now()))
            await asyncio.sleep(2)  # a is running when the engine closes: the run stays resumable
        return list(await journal.read("r"))

    events = run_virtual(interrupted())
    created_at = events[0].at
    old = {**OLD_FULL, "deadline_at": created_at + 60}
    spent = Event("r", "model_call", created_at + 1, None, {"cost_usd": 0.1, "prompt_tokens": 100,
                                                             "completion_tokens": 50})
    journal = _copy([*events, spent], old)

    async def resumed() -> tuple[JournaledLimits, str, float, list[Event]]:
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            recorded = JournaledLimits.from_events(await journal.read("r"))
            run = await engine.resume("r")
            recorded.apply_deadline(engine, run)
            result = await run.wait()
            return recorded, result.status, asyncio.get_running_loop().time(), list(await journal.read("r"))

    recorded, status, _t, after = run_virtual(resumed())
    assert status == "succeeded"
    assert recorded.limits == RunLimits(0.5, 1000, 60, 3) and recorded.deadline_at == created_at + 60
    assert (recorded.model, recorded.pressure, recorded.origin, recorded.context, recorded.subplans) == (
        "gpt-4o-mini", 0.8, "POST /runs", "summary", False)
    assert recorded.cascade is True and recorded.planner == "auto" and recorded.tiers == OLD_FULL["tiers"]
    assert recorded.parent == {"run": "p", "step": "s", "depth": 1} and recorded.api_key_env == "MY_KEY"
    assert (recorded.spent_usd, recorded.spent_tokens) == (0.1, 150)
    budget = recorded.budget()
    assert budget is not None and budget.remaining_tokens == 850
    assert after[-1].kind == "run_finished"


def test_a_run_journaled_without_limits_resumes_with_none(recorder: Recorder) -> None:
    async def go() -> tuple[JournaledLimits, str]:
        journal = MemoryJournal("memory://")
        async with Engine(journal, clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start(SLOW, run_id="r")
            recorded = JournaledLimits.from_events(await journal.read("r"))
            return recorded, (await run.wait()).status

    recorded, status = run_virtual(go())
    assert status == "succeeded" and recorded.limits == RunLimits() and recorded.deadline_at is None
    assert recorded.budget() is None and recorded.remaining_s(0.0) is None
