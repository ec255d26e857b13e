"""POST /runs gets the plan file loader's document checks (422 naming the problem) and the safe default timeout."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Live


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def step_doc(args: str) -> str:
    return '{"plan": {"steps": [{"id": "a", "tool": "noop", "args": {"x": ' + args + '}}]}}'


@pytest.mark.parametrize(("body", "message"), [
    (step_doc('"\\ud800"'), "lone surrogate (\\ud800)"),
    (step_doc(json.dumps(nested(150))), "nested more than 100 levels deep"),
    (json.dumps({"plan_yaml": "steps:\n- id: a\n  tool: noop\n  args: {x: " + "9" * 5000 + "}\n"}), "4,300 digits"),
    (json.dumps({"plan_yaml": "steps:\n- id: a\n  tool: noop\n  args: &x {x: *x}\n"}), "refers to itself"),
], ids=["surrogate", "nesting", "yaml-huge-int", "yaml-self-reference"])
async def test_a_submitted_plan_gets_the_document_checks(live: Live, body: str, message: str) -> None:
    async with live.client() as client:
        resp = await client.post("/runs", content=body, headers={"content-type": "application/json"})
        listed = await client.get("/runs")
    assert resp.status_code == 422, resp.text
    assert any(message in p["message"] for p in resp.json()["problems"]), resp.text
    assert listed.json() == []


async def test_a_submitted_plan_gets_the_safe_default_timeout(live: Live) -> None:
    plan = {"steps": [{"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "timeout": None}]}
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan": plan, "run_id": "t1"})
        assert resp.status_code == 201, resp.text
        await live.wait("t1")
    steps = live.run("t1").plan.steps
    assert (steps["a"].timeout, steps["b"].timeout) == (600.0, None)
