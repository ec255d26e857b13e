"""A worker calls its endpoint (``--base-url``, ``--api-key-env``, ``--header``) and each queued tier's own, with
their own keys; no key nor header value reaches the journal or the worker's log."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from tests.workers.conftest import Schema
from tests.workers.procs import TOOLS, start_worker, wait_until
from tests.workers.test_control import cli
from tests.workers.test_worker_limits import ended, report

pytestmark = [pytest.mark.postgres]

KEY_A = "sk-worker-alpha-0123456789"  # planted: never journaled nor logged
KEY_B = "sk-worker-bravo-0123456789"
HEADER_SECRET = "org-secret-worker-0123"


def echo(req: RecordedRequest) -> Reply:
    return Text(f"answer to {req.messages[-1]['content']}")


async def test_a_worker_calls_its_endpoint_and_each_tiers_own_with_their_keys(
        pg_schema: Schema, tmp_path: Path) -> None:
    server_a, server_b = ScriptedLLM(echo), ScriptedLLM(echo)
    async with server_a as url_a, server_b as url_b:
        (tmp_path / "tiers.json").write_text(json.dumps({
            "small": {"model": "small-m", "p_success": 0.6, "duration_s": 1, "cost_usd": 0},
            "big": {"model": "big-m", "p_success": 0.9, "duration_s": 2, "cost_usd": 0, "base_url": url_b,
                    "api_key_env": "PLANWEAVE_TEST_KEY_B"}}))
        (tmp_path / "plan.json").write_text(json.dumps({"steps": [
            {"id": "s", "tool": "llm", "args": {"prompt": "small question", "model": "small-m"}},
            {"id": "b", "tool": "llm", "args": {"prompt": "big question", "model": "big-m"}}]}))
        queued = cli("submit", str(tmp_path / "plan.json"), "--journal", pg_schema.url, "--tools", TOOLS,
                     "--model", "small-m", "--tiers", str(tmp_path / "tiers.json"), "--run-id", "routed")
        assert queued.returncode == 0, queued
        env = {**os.environ, "PLANWEAVE_TEST_KEY_A": KEY_A, "PLANWEAVE_TEST_KEY_B": KEY_B, "OPENAI_API_KEY": ""}
        worker = start_worker(pg_schema.url, "ew", tmp_path, "--base-url", url_a, "--config",
                              "api_key_env=PLANWEAVE_TEST_KEY_A", "--config", f'headers=["X-Org: {HEADER_SECRET}"]',
                              env=env)
        try:
            await asyncio.to_thread(wait_until, "the run to end", lambda: ended(pg_schema, "routed"), 60)
        finally:
            worker.stop()
    result = report(pg_schema, "routed")
    assert result["status"] == "succeeded", worker.text()
    assert [str(r.messages[-1]["content"]) for r in server_a.chat_requests] == ["small question"]
    assert [str(r.messages[-1]["content"]) for r in server_b.chat_requests] == ["big question"]
    assert [r.headers.get("authorization") for r in server_a.chat_requests] == [f"Bearer {KEY_A}"]
    assert [r.headers.get("authorization") for r in server_b.chat_requests] == [f"Bearer {KEY_B}"]
    assert server_a.chat_requests[0].headers.get("x-org") == HEADER_SECRET
    assert "x-org" not in server_b.chat_requests[0].headers
    stored = json.dumps(pg_schema.query("SELECT data FROM {s}.planweave_events WHERE run_id = %s", ("routed",)))
    assert "PLANWEAVE_TEST_KEY_B" in stored  # the tier's key variable, by name
    for secret in (KEY_A, KEY_B, HEADER_SECRET):
        assert secret not in stored and secret not in worker.text()
