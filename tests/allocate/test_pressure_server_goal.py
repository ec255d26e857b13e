"""A goal posted to the server with a deadline gets its live forecast (the dashboard's), and with
``deadline_pressure`` a forecast below it makes the planner re-plan with the time left, as ``planweave run --goal
--deadline-pressure`` does; the threshold is journaled for a resume, and a request that cannot use it is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planweave.limits import JournaledLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.allocate.test_pressure_server import LATE
from tests.server.conftest import start_live

# 'first' ends after 0.5 s (the planner has written both lines by then): the forecast that follows sees 'slow'
# (estimated 40 s) left of a 3 s deadline.
SLOW = [{"id": "first", "tool": "sleep", "args": {"seconds": 0.5}, "estimate": {"duration": 0.5}},
        {"id": "slow", "tool": "sleep", "args": {"seconds": 60}, "after": ["first"], "estimate": {"duration": 40}}]
QUICK = [{"id": "gist", "tool": "noop", "args": {"v": "gist"}}]


def planner(first: list[dict[str, Any]]) -> Callable[[RecordedRequest], Reply]:
    """The scripted model: the planner writes ``first``, a re-plan writes ``QUICK``, the joiner answers."""

    def script(request: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content")) for m in request.messages)
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": "the gist"}))
        return Text(plan_lines(QUICK if "Why a new plan is needed" in text else first))

    return script


script = planner(SLOW)


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.mark.parametrize("pressure", [0.5, None])
async def test_a_posted_goal_under_deadline_pressure_re_plans_with_the_time_left(journal_url: str,
                                                                                 pressure: float | None) -> None:
    body: dict[str, Any] = {"goal": "g", "deadline": 3}
    if pressure is not None:
        body["deadline_pressure"] = pressure
    async with start_live(journal_url, model=script) as live, live.client() as client:
        accepted = await client.post("/runs", json=body)
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        report = await live.finished(client, run_id)
        events = await live.journal_events(run_id)
    assert [e for e in events if e.kind == "forecast"], "a goal run with a deadline gets its live forecast"
    assert JournaledLimits.from_events(events).pressure == pressure
    escalations = [e for e in events if e.kind == "escalation" and e.data.get("rung") == "deadline_pressure"]
    if pressure is None:
        assert not escalations
        assert report["status"] != "succeeded"  # 'slow' ran into the deadline
    else:
        assert [e.data["action"] for e in escalations] == ["replan"]
        assert report["status"] == "succeeded", report
        assert report["answer"] == "the gist"
        assert "slow" not in report["steps"]  # the new version dropped it
        assert not [e for e in events if e.kind == "step_succeeded" and e.step == "slow"]


@pytest.mark.parametrize(("body", "problem"), [
    ({"goal": "g", "deadline_pressure": 0.5}, "give a deadline too"),
    ({"plan": {"steps": [{"id": "a", "tool": "noop"}]}, "deadline_pressure": 0.5}, "give a deadline too"),
])
async def test_deadline_pressure_without_a_deadline_is_refused_naming_the_field(journal_url: str,
                                                                               body: dict[str, Any],
                                                                               problem: str) -> None:
    async with start_live(journal_url, model=script) as live, live.client() as client:
        refused = await client.post("/runs", json=body)
        assert refused.status_code == 422, refused.text
        assert "deadline_pressure" in refused.text and problem in refused.text
        assert await live.engine.journal.run_ids() == []  # nothing of the refused run was journaled


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
async def test_a_deadline_pressure_outside_0_1_is_refused(journal_url: str, value: float) -> None:
    async with start_live(journal_url, model=script) as live, live.client() as client:
        refused = await client.post("/runs", json={"goal": "g", "deadline": 5, "deadline_pressure": value})
        assert refused.status_code == 422, refused.text
        assert "deadline_pressure" in refused.text


# At the stop 'slow' runs; on resume the plan still needs it (1 s, it says) and 'write' (40 s): late for the 30 s
# deadline, so the resumed run's first forecast fires the pressure.
STOPPED = [{"id": "slow", "tool": "sleep", "args": {"seconds": 60}, "estimate": {"duration": 1}},
           {"id": "write", "tool": "sleep", "args": {"seconds": 1}, "after": ["slow"], "estimate": {"duration": 40}}]


stopped_script = planner(STOPPED)


async def test_a_recovered_goal_run_keeps_its_deadline_pressure(journal_url: str) -> None:
    async with start_live(journal_url, model=stopped_script, recover=False) as first, first.client() as client:
        accepted = await client.post("/runs", json={"goal": "g", "deadline": 30, "deadline_pressure": 0.5})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        await first.until_step(run_id, "slow", "running")
    async with start_live(journal_url, model=stopped_script) as second, second.client() as client:
        assert second.server.recovered == [run_id]
        report = await second.finished(client, run_id)
        events = await second.journal_events(run_id)
    resumed_at = next(i for i, e in enumerate(events) if e.kind == "run_resumed")
    assert not [e for e in events[:resumed_at] if e.kind == "escalation"]  # the first server never saw it late
    (pressure,) = [e for e in events[resumed_at:] if e.kind == "escalation" and e.data.get("rung") ==
                   "deadline_pressure"]
    assert pressure.data["action"] == "replan"
    assert report["status"] == "succeeded", report
    assert report["answer"] == "the gist"


async def test_a_posted_plans_deadline_pressure_takes_the_default_actions(journal_url: str) -> None:
    # LATE (tests/allocate/test_pressure_server.py): once 'a' ends, the optional 'extra' no longer fits before the
    # 5 s deadline. The plan says no pressure:, the request's deadline_pressure asks for it.
    async with start_live(journal_url) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": LATE, "deadline": 5, "deadline_pressure": 0.5})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        report = await live.finished(client, run_id)
        events = await live.journal_events(run_id)
    assert JournaledLimits.from_events(events).pressure == 0.5  # a resume or a recovery watches it again
    assert report["status"] == "succeeded", report
    assert report["steps"]["extra"]["status"] == "cancelled"
    assert "drop_optional" in [e.data["action"] for e in events if e.kind == "escalation"]
