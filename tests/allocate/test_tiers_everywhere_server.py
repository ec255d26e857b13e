"""Tier tables over HTTP: ``POST /runs`` takes ``tiers`` (checked and bounded: a 422 names the field, the tier and
what is wrong), journals them in ``run_created``, and the server's recovery allocates the resumed run's
``model: auto`` steps from them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from planweave.limits import JournaledLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.conftest import gated_tools, start_live

TIERS = {
    "small": {"model": "m-small", "p_success": 0.5, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}


def auto(sid: str, after: list[str] | None = None) -> dict[str, Any]:
    return {"id": sid, "tool": "llm", "after": after or [],
            "args": {"prompt": f"{sid}?", "model": "auto", "tiers": ["small", "large"], "max_tokens": 10}}


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def answer(request: RecordedRequest) -> Reply:
    return Text(f"from {request.body['model']}")


async def test_a_posted_plan_with_tiers_is_allocated_and_journals_them(journal_url: str) -> None:
    # An 18 s deadline: small's retry (10 + 0.5 + 10 declared seconds) does not fit, large (15 s) does.
    plan = {"steps": [{**auto("a"), "retries": 2}]}
    async with start_live(journal_url, model=answer) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": plan, "tiers": TIERS, "deadline": 18})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        report = await live.finished(client, run_id)
        events = await live.journal_events(run_id)
    assert report["status"] == "succeeded", report
    (allocation,) = [e for e in events if e.kind == "allocation"]
    assert allocation.data["tier"] == "large" and allocation.data["model"] == "m-large"
    recorded = JournaledLimits.from_events(events)
    assert recorded.tiers is not None and recorded.tiers["large"]["model"] == "m-large"
    assert recorded.tiers["small"]["p_success"] == 0.5


async def test_bad_or_misplaced_tiers_are_refused_naming_the_field(journal_url: str) -> None:
    plan = {"steps": [auto("a")]}
    bad = {"small": {**TIERS["small"], "p_success": 2}}
    missing = {"small": {"model": "m", "duration_s": 1, "cost_usd": 0}}
    too_many = {f"t{i}": TIERS["small"] for i in range(33)}
    async with start_live(journal_url, model=answer) as live, live.client() as client:
        refused = {name: await client.post("/runs", json=body) for name, body in {
            "bad": {"plan": plan, "tiers": bad},
            "missing": {"plan": plan, "tiers": missing},
            "model": {"plan": plan, "tiers": {"small": {**TIERS["small"], "model": {"x": 1}}}},
            "too_many": {"plan": plan, "tiers": too_many},
            "goal": {"goal": "g", "tiers": TIERS},
        }.items()}
        listed = (await client.get("/runs")).json()
    async with start_live(journal_url) as bare, bare.client() as client:
        no_model = await client.post("/runs", json={"plan": {"steps": [{"id": "n", "tool": "noop"}]},
                                                    "tiers": TIERS})
    problems = {name: resp.json()["problems"][0] for name, resp in refused.items()}
    assert all(resp.status_code == 422 for resp in (*refused.values(), no_model))
    assert problems["bad"]["field"] == "tiers"
    assert problems["bad"]["message"] == "tiers: tier 'small': p_success must be in [0, 1], got 2.0"
    assert problems["missing"]["message"] == "tiers: tier 'small': missing field 'p_success'"
    assert "field 'model' must be a model name" in problems["model"]["message"]
    assert problems["too_many"]["field"] == "body.tiers"
    assert problems["goal"]["field"] == "tiers" and "POST a plan" in problems["goal"]["message"]
    assert no_model.json()["problems"][0]["field"] == "tiers"
    assert "planweave serve --model" in no_model.json()["problems"][0]["message"]
    assert listed == []  # nothing was started


async def test_the_servers_recovery_allocates_from_the_journaled_tiers(journal_url: str) -> None:
    plan = {"steps": [{"id": "gate", "tool": "gate"}, auto("after_gate", ["gate"])]}
    async with start_live(journal_url, tools=gated_tools(asyncio.Event()), model=answer) as first, \
            first.client() as client:
        accepted = await client.post("/runs", json={"plan": plan, "tiers": TIERS})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        await first.until_step(run_id, "gate", "running")
        # Stopped while the run waits at the gate: interrupted, resumable.
    async with start_live(journal_url, tools=gated_tools(None), model=answer) as second:
        assert second.server.recovered == [run_id]
        result = await second.wait(run_id)
        events = await second.journal_events(run_id)
    assert result.status == "succeeded", result.error
    resumed = next(i for i, e in enumerate(events) if e.kind == "run_resumed")
    allocations = [e for e in events[resumed:] if e.kind == "allocation"]
    assert [(e.step, e.data["policy"]) for e in allocations] == [("after_gate", "monte_carlo")]
    assert result.outputs["after_gate"]["text"].startswith("from m-")
