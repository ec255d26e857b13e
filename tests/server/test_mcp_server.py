"""The planweave MCP server (server/mcp.py) through the SDK's own client, in this process: every tool is the HTTP
API's route, so the answers are GET /runs/{id}'s read model, refusals are isError results naming what was wrong,
and a planted secret never appears in anything a client receives (results, errors, progress)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import Client

from planweave import open_engine
from planweave.server.app import create_app
from planweave.server.mcp import RunsAPI, build_mcp_server

SECRET = "sk-mcp-planted-0123456789abcdef"
TOKEN = "mcp-test-token"
PLAN = """\
steps:
  - {id: a, tool: noop, args: {x: 1}}
  - {id: ok, tool: noop, approval: "Ship it?", after: [a]}
  - {id: ask, tool: human.input, args: {prompt: "How many?", schema: {type: integer}}, after: [ok]}
  - {id: b, tool: noop, args: {n: "${ask}"}, after: [ask]}
"""


class Seen:
    """Everything the client received, as text: every result, error and progress message."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))
        self.texts.append(f"{progress} {total} {message}")

    def record(self, result: Any) -> Any:
        self.texts.append(result.model_dump_json())
        return result


@asynccontextmanager
async def mcp_client(monkeypatch: pytest.MonkeyPatch, seen: Seen) -> AsyncIterator[Any]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    async with open_engine("memory://") as engine:
        app = create_app(engine, TOKEN, recover=False)
        async with app.router.lifespan_context(app):
            api = RunsAPI(app, TOKEN)
            try:
                async with Client(build_mcp_server(api)) as client:

                    async def call(name: str, args: dict[str, Any], **kw: Any) -> Any:
                        return seen.record(await client.call_tool(name, args, progress_callback=seen.on_progress,
                                                                  **kw))

                    yield call
            finally:
                await api.aclose()


async def test_tools_list_names_each_tool_with_its_input_and_output_schema() -> None:
    async with open_engine("memory://") as engine:
        app = create_app(engine, TOKEN, recover=False)
        api = RunsAPI(app, TOKEN)
        async with Client(build_mcp_server(api)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
        await api.aclose()
    assert set(tools) == {"start_plan", "start_goal", "wait_run", "get_run", "get_step", "list_runs",
                          "approve_step", "send_input", "cancel_run"}
    assert tools["start_goal"].input_schema["required"] == ["goal"]
    assert all(t.output_schema is not None and t.description for t in tools.values())


async def test_a_plan_started_over_mcp_waits_for_approval_and_input_and_ends_with_its_outputs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Seen()
    async with mcp_client(monkeypatch, seen) as call:
        started = await call("start_plan", {"plan_yaml": PLAN, "run_id": "people"})
        assert not started.is_error and started.structured_content == {"run_id": "people", "status": "running"}
        waited = (await call("wait_run", {"run_id": "people", "timeout_s": 10})).structured_content
        assert waited["task_status"] == "input_required"
        assert waited["questions"] == [{"step": "ok", "waiting": "waiting_approval", "prompt": "Ship it?",
                                        "input_schema": None, "answer_with": "approve_step"}]
        assert (await call("approve_step", {"run_id": "people", "step": "ok"})).structured_content["outcome"] \
            == "applied"
        again = await call("approve_step", {"run_id": "people", "step": "ok", "approve": False})
        assert again.is_error and "the first reply is final: approved by" in again.content[0].text
        waited = (await call("wait_run", {"run_id": "people", "timeout_s": 10})).structured_content
        assert waited["task_status"] == "input_required"
        assert waited["questions"][0]["input_schema"] == {"type": "integer"}
        refused = await call("send_input", {"run_id": "people", "step": "ask", "value": "three"})
        assert refused.is_error and "ask" in refused.content[0].text  # the schema refused it: still waiting
        assert not (await call("send_input", {"run_id": "people", "step": "ask", "value": 3})).is_error
        done = (await call("wait_run", {"run_id": "people", "timeout_s": 10})).structured_content
        step = (await call("get_step", {"run_id": "people", "step": "b"})).structured_content
    assert done["task_status"] == "completed" and done["status"] == "succeeded"
    assert done["outputs"] == {"a": {"x": 1}, "ok": {}, "ask": 3, "b": {"n": 3}}
    assert step["status"] == "succeeded" and step["args"] == {"n": 3}
    counts = [p[0] for p in seen.progress]
    assert counts == sorted(set(counts)) and counts[-1] == 4  # progress grows with each notification
    assert all(SECRET not in text for text in seen.texts)


async def test_get_run_is_the_http_read_model_and_list_runs_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Seen()
    async with mcp_client(monkeypatch, seen) as call:
        for rid in ("one", "two"):
            await call("start_plan", {"plan": {"steps": [{"id": "s", "tool": "noop", "args": {"v": rid}}]},
                                      "run_id": rid, "wait_s": 10})
        report = (await call("get_run", {"run_id": "two"})).structured_content
        first = (await call("list_runs", {"limit": 1})).structured_content
        rest = (await call("list_runs", {"limit": 5, "cursor": first["next_cursor"]})).structured_content
        failed = (await call("list_runs", {"status": ["failed"]})).structured_content
    assert report["task_status"] == "completed" and report["outputs"] == {"s": {"v": "two"}}
    assert {"steps", "waiting", "root_cause", "cost_usd", "ran_s"} <= set(report)
    assert [r["run_id"] for r in first["runs"]] == ["two"] and [r["run_id"] for r in rest["runs"]] == ["one"]
    assert failed == {"runs": [], "next_cursor": None}


async def test_bad_input_is_an_error_result_naming_what_is_wrong_never_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Seen()
    async with mcp_client(monkeypatch, seen) as call:
        cases = {
            "unknown run": await call("get_run", {"run_id": "nope"}),
            "unknown step": await call("get_step", {"run_id": "nope", "step": "x"}),
            "unknown tool": await call("start_plan", {"plan_yaml": "steps: [{id: a, tool: nop}]"}),
            "both plans": await call("start_plan", {"plan_yaml": "steps: []", "plan": {"steps": []}}),
            "not yaml": await call("start_plan", {"plan_yaml": "steps: [unclosed"}),
            "no model": await call("start_goal", {"goal": "anything"}),
            "wrong model": await call("start_goal", {"goal": "anything", "model": "gpt-x"}),
            "bad type": await call("get_run", {"run_id": 7}),
            "missing": await call("approve_step", {"run_id": "x"}),
            "bad status": await call("list_runs", {"status": ["sideways"]}),
            "bad wait": await call("wait_run", {"run_id": "x", "timeout_s": -1}),
            "secret id": await call("get_run", {"run_id": SECRET}),
            "secret in a bad type": await call("get_run", {"run_id": {"key": SECRET}}),  # the SDK echoes it
            "no tool": await call("no_such_tool", {}),
        }
        still = (await call("list_runs", {})).structured_content
    texts = {name: r.content[0].text for name, r in cases.items()}
    assert all(r.is_error for r in cases.values()), texts
    assert "no run 'nope'" in texts["unknown run"]
    assert "did you mean 'noop'" in texts["unknown tool"]
    assert "exactly one of" in texts["both plans"]
    assert "no model" in texts["no model"] and "--model gpt-x" in texts["wrong model"]
    assert "sideways" in texts["bad status"]
    assert "***" in texts["secret id"] and "***" in texts["secret in a bad type"]
    assert still == {"runs": [], "next_cursor": None}  # the server went on serving
    assert all(SECRET not in text for text in seen.texts), [t for t in seen.texts if SECRET in t]


async def test_a_secret_in_a_plan_is_never_shown_in_results_errors_or_progress(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Seen()
    plan = {"steps": [{"id": "leak", "tool": "noop", "args": {"key": SECRET}},
                      {"id": "fail", "tool": "shell", "args": {"argv": ["false", SECRET]}, "retries": 0}],
            "on_failure": "continue"}
    async with mcp_client(monkeypatch, seen) as call:
        await call("start_plan", {"plan": plan, "run_id": "leaky", "wait_s": 20})
        for step in ("leak", "fail"):
            await call("get_step", {"run_id": "leaky", "step": step, "full": True})
        await call("get_run", {"run_id": "leaky"})
        await call("list_runs", {})
        await call("cancel_run", {"run_id": "leaky", "reason": f"because {SECRET}"})
    dump = json.dumps(seen.texts)
    assert "leaky" in dump and "***" in dump
    assert SECRET not in dump


async def test_the_servers_caps_bound_what_an_mcp_client_asks_for() -> None:
    from planweave.server.limits import LimitCaps

    async with open_engine("memory://") as engine:
        app = create_app(engine, TOKEN, recover=False, caps=LimitCaps(deadline=5))
        async with app.router.lifespan_context(app):
            api = RunsAPI(app, TOKEN)
            async with Client(build_mcp_server(api)) as client:
                over = await client.call_tool("start_plan", {"plan": {"steps": [{"id": "a", "tool": "noop"}]},
                                                             "deadline": 100})
                within = await client.call_tool("start_plan", {"plan": {"steps": [{"id": "a", "tool": "noop"}]},
                                                               "deadline": 2, "wait_s": 10})
            await api.aclose()
    assert over.is_error and "--max-deadline" in over.model_dump_json()
    assert not within.is_error and within.structured_content["task_status"] == "completed"


async def test_without_the_mcp_extra_the_endpoint_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    import planweave.extras

    real = planweave.extras.installed
    monkeypatch.setattr(planweave.extras, "installed", lambda module: module != "mcp" and real(module))
    async with open_engine("memory://") as engine:
        app = create_app(engine, TOKEN, recover=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            answer = await http.post("/mcp", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 501 and "pip install 'planweave[mcp]'" in answer.json()["detail"]
