"""A cascaded step's escalation over HTTP and in the dashboard (Debian's chromium, headless): a plan posted with
``tiers`` whose ``model: cascade`` step fails its schema on the small model is retried on the large one, and the
run's errors panel names the monitor and the tiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.browser import browser_page, require_browser
from tests.server.conftest import start_live

TIERS = {
    "small": {"model": "m-small", "p_success": 0.5, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
PLAN: dict[str, Any] = {"steps": [{"id": "ask", "tool": "llm", "retries": 2, "args": {
    "prompt": "ask?", "model": "cascade", "tiers": ["small", "large"], "schema": SCHEMA, "max_tokens": 20}}]}


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def by_model(request: RecordedRequest) -> Reply:
    return Text('{"answer": "yes"}' if request.body["model"] == "m-large" else '{"nope": 1}')


async def test_a_posted_cascade_escalates_and_the_dashboard_names_the_monitor(journal_url: str,
                                                                              tmp_path: Path) -> None:
    require_browser()
    from playwright.async_api import expect

    async with start_live(journal_url, model=by_model) as live, live.client() as client:
        created = await client.post("/runs", json={"plan": PLAN, "run_id": "cas", "tiers": TIERS})
        assert created.status_code == 201, created.text
        result = await live.wait("cas")
        assert result.status == "succeeded"
        errors: list[str] = []
        async with browser_page(tmp_path / "profile", errors) as page:
            await page.goto(f"{live.url}#token={live.token}")
            await page.goto(f"{live.url}#/runs/cas")
            escalation = page.locator("#errors .error-item.escalation")
            await expect(escalation).to_have_count(1, timeout=10_000)
            await expect(escalation).to_contain_text("escalation: escalate (milestone)")
            await expect(escalation).to_contain_text("small -> large: schema failed")
        events = await live.journal_events("cas")
    assert errors == []
    moves = [(e.step, e.data["monitor"], e.data["from_tier"], e.data["to_tier"]) for e in events
             if e.kind == "escalation" and e.data.get("rung") == "escalate"]
    assert moves == [("ask", "milestone", "small", "large")]
    assert [e.data["model"] for e in events if e.kind == "model_call"] == ["m-small", "m-large"]
