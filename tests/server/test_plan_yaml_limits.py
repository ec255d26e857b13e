"""A posted ``plan_yaml`` is read off the event loop within limits: a huge one gets its 422 naming the limit and the
line while the server keeps answering, and keys given twice are refused naming the key and the line."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from planweave.server import app as server_app

from .conftest import Live


def _huge_plan_yaml(keys: int) -> str:
    """One step with ``keys`` argument keys (the issue's 15 MB body had 10^6)."""
    return "steps:\n- id: a\n  tool: noop\n  args:\n" + "".join(f"    k{i}: {i % 10}\n" for i in range(keys))


async def test_a_huge_plan_yaml_gets_422_while_healthz_answers(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    reading = threading.Event()
    read = server_app._plan_document

    def observed(submission: Any) -> Any:
        reading.set()
        return read(submission)

    monkeypatch.setattr(server_app, "_plan_document", observed)
    body = {"plan_yaml": _huge_plan_yaml(1_000_001)}
    async with live.client() as client, live.client(token=None) as probe:
        post = asyncio.create_task(client.post("/runs", json=body, timeout=120))
        assert await asyncio.to_thread(reading.wait, 60), "the server never started reading the plan"
        # The plan is being read now: the loop must still serve other requests before the POST is answered.
        health = await probe.get("/healthz", timeout=60)
        answered_first = not post.done()
        resp = await asyncio.wait_for(post, 120)
    assert health.status_code == 200
    assert answered_first, "/healthz waited for the plan to be read: the plan was read on the event loop"
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["problems"]
    assert problem["field"] == "plan_yaml"
    assert "more than 1,000,000 values" in problem["message"]
    assert problem["message"].startswith("line ")


async def test_reading_a_plan_yaml_stops_at_the_time_limit(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_app, "PLAN_READ_SECONDS", 0.0)
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan_yaml": _huge_plan_yaml(10_000)}, timeout=60)
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["problems"]
    assert problem["field"] == "plan_yaml"
    assert "took longer than 0 s" in problem["message"]


@pytest.mark.parametrize(("text", "key", "line"), [
    ("steps:\n  - {id: a, tool: noop}\nsteps:\n  - {id: b, tool: noop}\n", "steps", 3),
    ("steps:\n  - id: a\n    tool: noop\n    id: b\n", "id", 4),
    ('{"steps": [{"id": "a", "tool": "noop", "id": "b"}]}', "id", 1),
])
async def test_a_plan_yaml_giving_a_key_twice_is_refused(live: Live, text: str, key: str, line: int) -> None:
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan_yaml": text})
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["problems"]
    assert problem["field"] == "plan_yaml"
    assert problem["message"].startswith(f"line {line}, ")
    assert f"the key '{key}' is given twice" in problem["message"]


@pytest.mark.parametrize(("body", "key"), [
    ('{"plan": {"steps": [{"id": "a", "tool": "noop"}], "steps": [{"id": "b", "tool": "noop"}]}}', "steps"),
    ('{"plan": {"steps": [{"id": "a", "tool": "noop", "id": "b"}]}}', "id"),
])
async def test_a_plan_object_giving_a_key_twice_is_refused(live: Live, body: str, key: str) -> None:
    async with live.client() as client:
        resp = await client.post("/runs", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["problems"]
    assert problem["field"] == "plan"
    assert problem["message"].startswith("line 1, column ")
    assert f"the key '{key}' is given twice" in problem["message"]
