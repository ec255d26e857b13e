"""One request that cannot be journaled is refused alone: the server keeps answering everyone else (issue 8 #1)."""

from __future__ import annotations

import json
from pathlib import Path

from planweave import builtin_tools
from planweave.journal import open_journal
from planweave.tools.registry import Toolbox

from .conftest import Live, start_live

SURROGATE = {"plan": {"steps": [{"id": "a", "tool": "noop", "args": {"x": "\ud800"}}]}}


async def test_a_plan_with_a_lone_surrogate_is_422_and_the_server_keeps_working(live: Live) -> None:
    async with live.client() as client:
        # json.dumps writes the surrogate as the escape "\ud800", exactly what a client sends on the wire.
        body = json.dumps(SURROGATE)
        refused = await client.post("/runs", content=body, headers={"Content-Type": "application/json"})
        accepted = await client.post("/runs", json={"plan": {"steps": [{"id": "a", "tool": "noop"}]}, "run_id": "ok"})
        listed = await client.get("/runs")
        result = await live.wait("ok")
        again = await client.get("/runs")
    assert refused.status_code == 422, refused.text
    assert "surrogate" in refused.text and "x" in refused.text
    assert accepted.status_code == 201, accepted.text
    assert listed.status_code == 200, listed.text
    assert result.ok
    assert again.status_code == 200
    assert [run["run_id"] for run in again.json()] == ["ok"]


async def test_tool_text_with_lone_surrogates_does_not_poison_the_server(tmp_path: Path) -> None:
    box: Toolbox = builtin_tools()

    async def mangle(name: str) -> str:
        """Fail with a message holding a lone surrogate."""
        raise OSError(f"no such file: {name}\udcff")

    box.add(mangle, idempotent=True)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"steps": [{"id": "m", "tool": "mangle", "args": {"name": "f"}, "retries": 0}]}
    async with start_live(url, tools=box) as live, live.client() as client:
        first = await client.post("/runs", json={"plan": plan, "run_id": "mangled"})
        failed = await live.wait("mangled")
        second = await client.post("/runs", json={"plan": {"steps": [{"id": "a", "tool": "noop"}]}, "run_id": "ok"})
        ok = await live.wait("ok")
        shown = await client.get("/runs/mangled")
        listed = await client.get("/runs")
    assert first.status_code == 201 and second.status_code == 201
    assert failed.status == "failed" and ok.ok
    assert shown.status_code == 200 and listed.status_code == 200
    assert "no such file: f\ufffd" in shown.text
    async with open_journal(url) as journal:
        assert await journal.run_ids() == ["mangled", "ok"]


INPUT_PLAN = {"steps": [
    {"id": "ask", "tool": "human.input", "args": {"prompt": "Name?"}},
    {"id": "use", "tool": "noop", "args": {"name": "${ask}"}},
]}


async def test_a_value_that_cannot_be_journaled_is_422_and_the_step_keeps_waiting(live: Live) -> None:
    async with live.client() as client:
        await client.post("/runs", json={"plan": INPUT_PLAN, "run_id": "asks"})
        await live.until_step("asks", "ask", "waiting_input")
        bad = await client.post("/runs/asks/steps/ask/input", content=json.dumps({"value": ["ok", "\udfff"]}),
                                headers={"Content-Type": "application/json"})
        listed = await client.get("/runs")
        good = await client.post("/runs/asks/steps/ask/input", json={"value": "Ada"})
        result = await live.wait("asks")
    assert bad.status_code == 422, bad.text
    assert "surrogate" in bad.text, bad.text
    assert listed.status_code == 200
    assert good.status_code == 200, good.text
    assert result.ok and result.outputs["use"] == {"name": "Ada"}
