"""What the dashboard reads on load costs the server little for a run this server created: the run index takes the
run's validated plan instead of validating its journaled document again (0.6 s of the event loop for 10,000 steps),
whether the run still runs or has ended; ``GET /runs/{id}/plan`` answers a running run without refreshing the index,
and a plan version's step views are built once, the statuses filled in per answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from planweave.core.plan.graph import validate_plan
from planweave.server import runs

from .conftest import gated_tools, start_live


async def test_a_running_plan_is_not_validated_again_and_its_views_show_current_statuses(
    journal_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    validated: list[str] = []
    real = validate_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        validated.append(str(kwargs.get("source")))
        return real(*args, **kwargs)

    monkeypatch.setattr("planweave.server.runs.validate_plan", counting)  # the index validates journaled plans so
    gate = asyncio.Event()
    steps: list[dict[str, Any]] = [{"id": f"s{i}", "tool": "noop", "args": {"i": i}} for i in range(40)]
    steps += [{"id": "g", "tool": "gate"}, {"id": "last", "tool": "noop", "after": ["g"]}]
    async with start_live(journal_url, tools=gated_tools(gate)) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": {"steps": steps}, "run_id": "r"})
        assert created.status_code == 201, created.text
        await live.until_step("r", "g", "running")
        # A run not running here is read from the index: this folds the running run's events into it too.
        assert (await client.get("/runs/elsewhere")).status_code == 404
        first = (await client.get("/runs/r/plan")).json()
        again = (await client.get("/runs/r/plan")).json()
        assert first == again
        by_id = {s["id"]: s for s in first["steps"]}
        assert [by_id["g"]["status"], by_id["last"]["status"]] == ["running", "pending"]
        assert by_id["last"]["deps"] == ["g"] and len(by_id) == 42
        assert validated == [], validated  # the index took the running run's plan
        plan = live.run("r").state.plan
        assert runs._step_views(plan) is runs._step_views(plan)  # built once per plan version
        gate.set()
        await live.wait("r")
        done = (await client.get("/runs/r/plan")).json()  # from the index now: the same views, new statuses
        assert {s["id"]: s["status"] for s in done["steps"]} == {s["id"]: "succeeded" for s in steps}
        assert [{k: v for k, v in s.items() if k != "status"} for s in done["steps"]] == \
            [{k: v for k, v in s.items() if k != "status"} for s in first["steps"]]
        # A run that ended before the index first saw it: its plan as this engine validated it, kept until folded.
        created = await client.post("/runs", json={"plan": {"steps": steps[:3]}, "run_id": "ended"})
        assert created.status_code == 201, created.text
        await live.wait("ended")
        ended = await client.get("/runs/ended")
        assert ended.status_code == 200 and ended.json()["status"] == "succeeded", ended.text
        assert validated == [], validated
    # A run this process does not run is validated from its journaled document, as before.
    async with start_live(journal_url, recover=False) as other, other.client() as client:
        answer = await client.get("/runs/r/plan")
        assert answer.status_code == 200, answer.text
        assert answer.json()["steps"] == done["steps"]
    assert set(validated) == {"run 'r'", "run 'ended'"}, validated
