"""`POST /runs {"goal": ..., "context": ..., "subplans": ...}` chooses a goal run's planning modes, journaled as
``planweave run --goal --context ... --no-subplans`` journals them; a plan run has no planner to give them to."""

from __future__ import annotations

import json

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines
from tests.server.conftest import Live, start_live


async def test_a_posted_goal_plans_with_the_context_and_subplans_it_asks_for(journal_url: str) -> None:
    systems: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "ok"}))
        systems.append(str(req.messages[0]["content"]))
        return Text(plan_lines([{"id": "a", "tool": "noop", "args": {}}]))

    async with start_live(journal_url, model=script) as live, live.client() as client:
        accepted = await client.post("/runs", json={"goal": "g", "context": "summary", "subplans": False})
        assert accepted.status_code == 201, accepted.text
        rid = accepted.json()["run_id"]
        report = await live.finished(client, rid)
        default = await client.post("/runs", json={"goal": "g"})
        await live.finished(client, default.json()["run_id"])
        events = await live.engine.journal.read(rid)
        plain = await live.engine.journal.read(default.json()["run_id"])
    assert report["status"] == "succeeded"
    limits = events[0].data["options"]["limits"]
    assert (limits["context"], limits["subplans"]) == ("summary", False)
    assert {k: plain[0].data["options"]["limits"][k] for k in ("context", "subplans")} == {
        "context": "references", "subplans": True}
    assert "- plan:" not in systems[0] and "Keep a report" not in systems[0]
    assert "- plan:" in systems[1] and "Keep a report" in systems[1]


async def test_planning_modes_are_refused_for_a_plan_run_and_a_bad_context_is_422(live: Live) -> None:
    async with live.client() as client:
        plan = await client.post("/runs", json={"plan": {"steps": []}, "context": "summary"})
        bad = await client.post("/runs", json={"goal": "g", "context": "everything"})
    assert plan.status_code == 422 and "only a goal run has a planner" in plan.json()["detail"], plan.text
    assert bad.status_code == 422 and "context" in bad.text
