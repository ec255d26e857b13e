"""`GET /runs/{id}/steps/{step}` and the outputs of `GET /runs/{id}`: what a step got, did and returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planweave.journal.base import encode_blob
from planweave.tools import builtin_tools
from planweave.tools.registry import Toolbox

from .conftest import Live, start_live

SECRET = "sk-verysecret-0123456789"


async def boom(reason: str) -> None:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


def tools() -> Toolbox:
    box = builtin_tools()
    box.add(boom, name="boom")
    return box


PLAN = {"steps": [
    {"id": "fetch", "tool": "sleep", "args": {"seconds": 0.01, "result": {"rows": [1, 2, 3], "name": "oslo"}}},
    {"id": "count", "tool": "noop", "args": {"n": "${fetch.rows[2]}", "label": "city ${fetch.name}"}},
    {"id": "broken", "tool": "boom", "args": {"reason": "${fetch.name}"}, "retries": {"max": 1, "backoff": 0.01}},
]}


async def test_a_step_shows_its_rendered_args_attempts_and_output(journal_url: str) -> None:
    async with start_live(journal_url, tools=tools()) as live, live.client() as client:
        resp = await client.post("/runs", json={"plan": PLAN, "run_id": "r1"})
        assert resp.status_code == 201, resp.text
        await live.wait("r1")
        count = (await client.get("/runs/r1/steps/count")).json()
        broken = (await client.get("/runs/r1/steps/broken")).json()
        report = (await client.get("/runs/r1")).json()
    assert count["status"] == "succeeded"
    assert count["args"] == {"n": 3, "label": "city oslo"}
    assert count["output"] == {"n": 3, "label": "city oslo"}
    assert [a["outcome"] for a in count["attempts"]] == ["succeeded"]
    assert count["error"] is None
    assert broken["status"] == "failed"
    assert broken["args"] == {"reason": "oslo"}
    assert broken["output"] is None
    assert broken["error"] == "ValueError: boom: oslo"
    assert [(a["outcome"], a["error"]) for a in broken["attempts"]] == [
        ("failed", "ValueError: boom: oslo"), ("failed", "ValueError: boom: oslo")]
    assert report["outputs"] == {"fetch": {"rows": [1, 2, 3], "name": "oslo"}, "count": {"n": 3, "label": "city oslo"}}


async def test_a_step_of_a_run_from_an_earlier_server_is_read_from_the_journal(journal_url: str) -> None:
    async with start_live(journal_url) as live, live.client() as client:
        await client.post("/runs", json={"plan": {"steps": PLAN["steps"][:2]}, "run_id": "r2"})
        await live.wait("r2")
    async with start_live(journal_url) as live, live.client() as client:
        count = (await client.get("/runs/r2/steps/count")).json()
        report = (await client.get("/runs/r2")).json()
    assert count["args"] == {"n": 3, "label": "city oslo"} and count["output"] == count["args"]
    assert report["outputs"]["count"] == {"n": 3, "label": "city oslo"}


async def test_unknown_runs_and_steps_are_404_naming_them(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": {"steps": [{"id": "fetch", "tool": "noop"}]}, "run_id": "r3"})
        await live.wait("r3")
        no_run = await client.get("/runs/nope/steps/fetch")
        no_step = await client.get("/runs/r3/steps/fetc")
    assert no_run.status_code == 404 and no_run.json()["detail"] == "no run 'nope' in the journal"
    assert no_step.status_code == 404
    assert no_step.json()["detail"] == "run 'r3' has no step 'fetc' (did you mean 'fetch'?)"


async def test_a_huge_output_is_truncated_unless_asked_for_in_full(live: Live) -> None:
    text = "x" * 300_000
    async with live.client() as client:
        await client.post("/runs", json={"plan": {"steps": [{"id": "big", "tool": "noop", "args": {"text": text}}]},
                                         "run_id": "r4"})
        await live.wait("r4")
        shown = (await client.get("/runs/r4/steps/big")).json()
        full = (await client.get("/runs/r4/steps/big", params={"full": 1})).json()
        report = (await client.get("/runs/r4")).json()
    digest, encoded = encode_blob({"text": text})
    marker = shown["output"]
    assert marker == {"truncated": True, "bytes": len(encoded), "sha256": digest}
    assert report["outputs"]["big"] == marker
    assert full["output"] == {"text": text}


async def test_secrets_are_shown_as_stars(journal_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", SECRET)
    plan = {"steps": [{"id": "leak", "tool": "noop", "args": {"auth": f"Bearer {SECRET}"}}]}
    async with start_live(journal_url) as live, live.client() as client:
        await client.post("/runs", json={"plan": plan, "run_id": "r5"})
        await live.wait("r5")
        detail = await client.get("/runs/r5/steps/leak")
        full = await client.get("/runs/r5/steps/leak?full=1")
        report = await client.get("/runs/r5")
    for resp in (detail, full, report):
        assert SECRET not in resp.text
    body: dict[str, Any] = detail.json()
    assert body["args"] == {"auth": "Bearer ***"} and body["output"] == {"auth": "Bearer ***"}
