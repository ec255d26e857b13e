"""Endpoint, key and headers per run and per tier: two runs of one process talk to two endpoints, each with its own
key, and no key (nor a header's value) is ever journaled, printed or shown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from planweave import Toolbox, builtin_tools, open_engine, open_journal
from planweave.allocate import TierTable
from planweave.allocate.model import AllocationError
from planweave.limits import JournaledLimits, RunLimits
from planweave.models import Endpoint, EndpointError, RoutedClient, open_routes, parse_headers, resolve_model
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from planweave.tools.llm import llm_tool

KEY_A = "sk-alpha-0123456789abcdef"  # planted: must never reach a journal, a report or a log
KEY_B = "sk-bravo-0123456789abcdef"
HEADER_SECRET = "org-secret-0123456789"


def journal_bytes(directory: Path) -> bytes:
    """Every byte of the SQLite journal in ``directory`` (its WAL too)."""
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.name.startswith("runs.db"))


def echo(req: RecordedRequest) -> Reply:
    return Text(f"answer to {req.messages[-1]['content']}")


def llm_plan(prefix: str, n: int = 3, model: str | None = None) -> dict[str, Any]:
    return {"steps": [{"id": f"{prefix}{i}", "tool": "llm",
                       "args": {"prompt": f"{prefix} question {i}", **({"model": model} if model else {})}}
                      for i in range(n)]}


def prompts(server: ScriptedLLM) -> list[str]:
    return [str(r.messages[-1]["content"]) for r in server.chat_requests]


def authorizations(server: ScriptedLLM) -> set[str]:
    return {r.headers.get("authorization", "") for r in server.chat_requests}


# -- the type --------------------------------------------------------------------------------------------------
def test_an_endpoint_journals_the_key_variable_never_the_key_nor_header_values() -> None:
    endpoint = Endpoint("http://127.0.0.1:1/v1", "KEY_A", headers=(("X-Org", HEADER_SECRET),))
    assert endpoint.journaled() == {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "KEY_A",
                                    "header_names": ["X-Org"]}
    literal = Endpoint("https://user:pw@example.com/v1", api_key=KEY_A)
    assert literal.journaled() == {}  # a URL carrying a credential stays out too
    assert KEY_A not in repr(literal) and HEADER_SECRET not in repr(endpoint)


def test_a_key_variable_that_is_unset_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANWEAVE_TEST_UNSET_KEY", raising=False)
    with pytest.raises(EndpointError, match="PLANWEAVE_TEST_UNSET_KEY") as caught:
        Endpoint(api_key_env="PLANWEAVE_TEST_UNSET_KEY").key()
    assert caught.value.field == "api_key_env"


@pytest.mark.parametrize(("doc", "field"), [
    ({"base_url": "ftp://x"}, "base_url"),
    ({"api_key_env": "not a name"}, "api_key_env"),
    ({"api_key": KEY_A}, "api_key"),
    ({"headers": {"Authorization": "Bearer x"}}, "headers"),
    ({"headers": {"X-A": "one\ntwo"}}, "headers"),
    ({"base": "http://x"}, "base"),
])
def test_an_endpoint_from_a_document_is_checked_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(EndpointError) as caught:
        Endpoint.from_mapping(doc)
    assert caught.value.field == field
    assert KEY_A not in str(caught.value)


def test_headers_flags_are_parsed() -> None:
    assert parse_headers(["X-Org: acme", "X-Trace:1"]) == (("X-Org", "acme"), ("X-Trace", "1"))
    with pytest.raises(EndpointError, match="--header"):
        parse_headers(["no colon"])


def test_a_tier_on_another_endpoint_inherits_nothing_of_the_runs_key_or_headers() -> None:
    run = Endpoint("http://a/v1", "KEY_A", headers=(("X-Org", "acme"),))
    assert Endpoint("http://b/v1").over(run) == Endpoint("http://b/v1")
    assert Endpoint(api_key_env="KEY_B").over(run) == Endpoint("http://a/v1", "KEY_B", headers=(("X-Org", "acme"),))


def test_tiers_naming_one_model_on_two_endpoints_are_refused() -> None:
    tier = {"model": "m", "p_success": 0.9, "duration_s": 1, "cost_usd": 0}
    with pytest.raises(AllocationError, match="another endpoint"):
        TierTable.from_mapping({"a": tier, "b": {**tier, "base_url": "http://b/v1"}})
    with pytest.raises(AllocationError, match="api_key_env"):
        TierTable.from_mapping({"a": {**tier, "api_key": KEY_A}})
    table = TierTable.from_mapping({"a": tier, "b": {**tier, "model": "n", "base_url": "http://b/v1",
                                                     "api_key_env": "KEY_B", "headers": {"X-T": "v"}}})
    assert table.to_mapping()["b"]["api_key_env"] == "KEY_B" and "headers" not in table.to_mapping()["b"]
    assert TierTable.from_mapping(table.to_mapping()).endpoints() == {"n": Endpoint("http://b/v1", "KEY_B")}


# -- two runs, two endpoints, one process ---------------------------------------------------------------------
async def test_two_runs_in_one_engine_talk_to_their_own_endpoints_with_their_own_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANWEAVE_TEST_KEY_A", KEY_A)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    server_a, server_b = ScriptedLLM(echo, ttft=0.01), ScriptedLLM(echo, ttft=0.01)
    async with server_a as url_a, server_b as url_b, contextlib.AsyncExitStack() as stack:
        endpoint_a = Endpoint(url_a, "PLANWEAVE_TEST_KEY_A", headers=(("X-Org", HEADER_SECRET),))
        endpoint_b = Endpoint(url_b, api_key=KEY_B)  # a literal key: Python callers only
        client_a = await stack.enter_async_context(resolve_model("model-a", endpoint=endpoint_a))
        client_b = await stack.enter_async_context(resolve_model("model-b", endpoint=endpoint_b))
        engine = await stack.enter_async_context(open_engine(url, tools=builtin_tools()))
        runs = []
        for prefix, client, endpoint in (("alpha", client_a, endpoint_a), ("bravo", client_b, endpoint_b)):
            tools = builtin_tools().merged(Toolbox({"llm": llm_tool(client)}))
            runs.append(await engine.start(llm_plan(prefix, 4), tools=tools, run_id=prefix, limits=RunLimits(
                budget_tokens=100_000).journaled(engine.clock.now(), client.model, **endpoint.journaled())))
        results = await asyncio.gather(*(r.wait() for r in runs))
        events = {r.id: await engine.journal.read(r.id) for r in runs}
    assert [r.status for r in results] == ["succeeded", "succeeded"]
    assert sorted(prompts(server_a)) == [f"alpha question {i}" for i in range(4)]
    assert sorted(prompts(server_b)) == [f"bravo question {i}" for i in range(4)]
    assert authorizations(server_a) == {f"Bearer {KEY_A}"} and authorizations(server_b) == {f"Bearer {KEY_B}"}
    assert {r.headers.get("x-org") for r in server_a.chat_requests} == {HEADER_SECRET}
    assert {r.headers.get("x-org") for r in server_b.chat_requests} == {None}
    # A resume reads the endpoint back: its URL and the variable's name (a literal key: nothing to read back).
    recorded_a = JournaledLimits.from_events(events["alpha"])
    assert (recorded_a.base_url, recorded_a.api_key_env) == (url_a, "PLANWEAVE_TEST_KEY_A")
    recorded_b = JournaledLimits.from_events(events["bravo"])
    assert (recorded_b.base_url, recorded_b.api_key_env) == (url_b, None)
    stored = journal_bytes(tmp_path)
    assert b"PLANWEAVE_TEST_KEY_A" in stored
    for secret in (KEY_A, KEY_B, HEADER_SECRET):
        assert secret.encode() not in stored


async def test_a_routed_client_sends_each_tiers_model_to_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANWEAVE_TEST_KEY_B", KEY_B)
    server_a, server_b = ScriptedLLM(echo), ScriptedLLM(echo)
    async with server_a as url_a, server_b as url_b, contextlib.AsyncExitStack() as stack:
        table = TierTable.from_mapping({
            "small": {"model": "small-m", "p_success": 0.6, "duration_s": 1, "cost_usd": 0},
            "big": {"model": "big-m", "p_success": 0.9, "duration_s": 2, "cost_usd": 0, "base_url": url_b,
                    "api_key_env": "PLANWEAVE_TEST_KEY_B"},
        })
        run_endpoint = Endpoint(url_a, api_key=KEY_A)
        default = await stack.enter_async_context(resolve_model("small-m", endpoint=run_endpoint))
        client = await open_routes(stack, default, table.endpoints(), run_endpoint)
        assert isinstance(client, RoutedClient)
        tool = llm_tool(client)
        await tool.invoke({"prompt": "to the small one", "model": "small-m"})
        await tool.invoke({"prompt": "to the big one", "model": "big-m"})
    assert prompts(server_a) == ["to the small one"] and authorizations(server_a) == {f"Bearer {KEY_A}"}
    assert prompts(server_b) == ["to the big one"] and authorizations(server_b) == {f"Bearer {KEY_B}"}


# -- the CLI -----------------------------------------------------------------------------------------------------
async def planweave(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_run_with_tiers_on_two_endpoints_and_a_key_variable_shows_no_key(tmp_path: Path) -> None:
    env = {"PLANWEAVE_TEST_KEY_A": KEY_A, "PLANWEAVE_TEST_KEY_B": KEY_B, "OPENAI_API_KEY": ""}
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    server_a, server_b = ScriptedLLM(echo), ScriptedLLM(echo)
    async with server_a as url_a, server_b as url_b:
        (tmp_path / "tiers.json").write_text(json.dumps({
            "small": {"model": "small-m", "p_success": 0.6, "duration_s": 1, "cost_usd": 0},
            "big": {"model": "big-m", "p_success": 0.9, "duration_s": 2, "cost_usd": 0, "base_url": url_b,
                    "api_key_env": "PLANWEAVE_TEST_KEY_B"}}))
        (tmp_path / "plan.json").write_text(json.dumps({"steps": [
            {"id": "s", "tool": "llm", "args": {"prompt": "small question", "model": "small-m"}},
            {"id": "b", "tool": "llm", "args": {"prompt": "big question", "model": "big-m"}}]}))
        code, out, err = await planweave(
            "run", "plan.json", "--model", "small-m", "--config", "tiers=tiers.json", "--base-url", url_a,
            "--config", "api_key_env=PLANWEAVE_TEST_KEY_A", "--config", f'headers=["X-Org: {HEADER_SECRET}"]',
            "--journal", journal, "--json", cwd=tmp_path, env=env)
        assert code == 0, err
        run_id = json.loads(out)["run_id"]
        shown = await planweave("show", run_id, "--journal", journal, "--json", cwd=tmp_path, env=env)
    assert prompts(server_a) == ["small question"] and prompts(server_b) == ["big question"]
    assert authorizations(server_a) == {f"Bearer {KEY_A}"} and authorizations(server_b) == {f"Bearer {KEY_B}"}
    assert server_a.chat_requests[0].headers.get("x-org") == HEADER_SECRET
    assert "x-org" not in server_b.chat_requests[0].headers  # another endpoint: the run's headers stay home
    stored = journal_bytes(tmp_path)
    assert b"PLANWEAVE_TEST_KEY_A" in stored and b"PLANWEAVE_TEST_KEY_B" in stored
    for secret in (KEY_A, KEY_B, HEADER_SECRET):
        assert secret not in out + err + shown[1] + shown[2]
        assert secret.encode() not in stored


async def test_a_resume_calls_the_journaled_endpoint_with_the_journaled_key_variable(tmp_path: Path) -> None:
    env = {"PLANWEAVE_TEST_KEY_A": KEY_A, "OPENAI_API_KEY": "", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    server = ScriptedLLM(echo)
    async with server as url_a:
        (tmp_path / "plan.json").write_text(json.dumps({"steps": [
            {"id": "wait", "tool": "sleep", "args": {"seconds": 1.5}},
            {"id": "ask", "tool": "llm", "args": {"prompt": "after the wait"}, "after": ["wait"]}]}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "planweave.cli.main", "run", "plan.json", "--model", "m", "--base-url", url_a,
            "--config", "api_key_env=PLANWEAVE_TEST_KEY_A", "--journal", journal, "--json", cwd=tmp_path,
            env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        run_id = None
        for _ in range(200):  # until 'wait' runs, then kill -9: the llm step has not called yet
            await asyncio.sleep(0.05)
            if (tmp_path / "runs.db").exists():
                async with open_journal(journal) as opened:
                    ids = await opened.run_ids()
                    if ids and any(e.kind == "step_started" for e in await opened.read(ids[0])):
                        run_id = ids[0]
                        break
        assert run_id is not None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        code, out, err = await planweave("resume", run_id, "--journal", journal, "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    assert json.loads(out)["status"] == "succeeded"
    assert prompts(server) == ["after the wait"]
    assert authorizations(server) == {f"Bearer {KEY_A}"}  # neither --base-url nor --api-key-env given again
    assert KEY_A not in out + err


async def test_a_key_and_a_header_echoed_back_are_redacted_whatever_the_variables_name(tmp_path: Path) -> None:
    env = {"MY_LLM_ACCESS": KEY_A, "OPENAI_API_KEY": ""}  # a name the environment's secret patterns do not match
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    server = ScriptedLLM(echo)
    async with server as url:
        (tmp_path / "plan.json").write_text(json.dumps({"steps": [
            {"id": "ask", "tool": "llm", "args": {"prompt": f"repeat {KEY_A} and {HEADER_SECRET}"}}]}))
        code, out, err = await planweave("run", "plan.json", "--model", "m", "--base-url", url, "--config",
                                         "api_key_env=MY_LLM_ACCESS", "--config", f'headers=["X-Org: {HEADER_SECRET}"]',
                                         "--journal", journal, "--json", cwd=tmp_path, env=env)
        shown = await planweave("show", json.loads(out)["run_id"], "--journal", journal, "--json", cwd=tmp_path,
                                env=env)
    assert code == 0, err
    assert prompts(server) == [f"repeat {KEY_A} and {HEADER_SECRET}"]  # the running plan keeps the values
    stored = journal_bytes(tmp_path)
    for secret in (KEY_A, HEADER_SECRET):
        assert secret.encode() not in stored
        assert secret not in out + err + shown[1] + shown[2]
    assert "answer to repeat *** and ***" in out and "answer to repeat *** and ***" in shown[1]


async def test_a_key_variable_that_is_unset_exits_2_naming_it_before_any_call(tmp_path: Path) -> None:
    server = ScriptedLLM(echo)
    async with server as url:
        (tmp_path / "plan.json").write_text(json.dumps(llm_plan("x", 1)))
        code, _, err = await planweave("run", "plan.json", "--model", "m", "--base-url", url, "--config",
                                       "api_key_env=PLANWEAVE_TEST_NEVER_SET", "--journal",
                                       f"sqlite:///{tmp_path / 'r.db'}", cwd=tmp_path, env={})
    assert code == 2, err
    assert "PLANWEAVE_TEST_NEVER_SET" in err and "Traceback" not in err
    assert server.chat_requests == []


async def test_a_goal_runs_planner_and_steps_reach_their_tiers_endpoints(tmp_path: Path) -> None:
    def planner(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "done"}))
        return Text(plan_lines([{"id": "q", "tool": "llm", "args": {"prompt": "for the big tier", "model": "big-m"}}]))

    env = {"PLANWEAVE_TEST_KEY_A": KEY_A, "PLANWEAVE_TEST_KEY_B": KEY_B, "OPENAI_API_KEY": ""}
    server_a, server_b = ScriptedLLM(planner), ScriptedLLM(echo)
    async with server_a as url_a, server_b as url_b:
        (tmp_path / "tiers.json").write_text(json.dumps({
            "small": {"model": "small-m", "p_success": 0.6, "duration_s": 1, "cost_usd": 0},
            "big": {"model": "big-m", "p_success": 0.9, "duration_s": 2, "cost_usd": 0, "base_url": url_b,
                    "api_key_env": "PLANWEAVE_TEST_KEY_B"}}))
        code, out, err = await planweave(
            "goal", "use the big tier", "--model", "small-m", "--config", "tiers=tiers.json", "--config",
            "cascade=true",
            "--base-url", url_a, "--config", "api_key_env=PLANWEAVE_TEST_KEY_A", "--journal",
            f"sqlite:///{tmp_path / 'runs.db'}", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    assert json.loads(out)["answer"] == "done"
    assert server_a.chat_requests and authorizations(server_a) == {f"Bearer {KEY_A}"}  # the planner and joiner
    assert prompts(server_b) == ["for the big tier"] and authorizations(server_b) == {f"Bearer {KEY_B}"}
    assert KEY_A not in out + err and KEY_B not in out + err
