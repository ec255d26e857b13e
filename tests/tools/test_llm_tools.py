"""``llm`` steps with ``tools``: the model's calls run as steps of the run (journaled, limited, approved), in parallel,
their results sent back as tool messages in the dialect's shape; a resumed step does not call a finished tool again.
Against the scripted server in Chat Completions, the Responses API and Anthropic Messages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from planweave import Tool, Toolbox, open_engine
from planweave.core.events import Event
from planweave.engine.runtime import Run
from planweave.models import Budget, client_class
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.models.pricing import Price, PriceTable
from planweave.testing import Call, RecordedRequest, Reply, ScriptedLLM, Text
from planweave.tools.llm import llm_tool
from planweave.tools.llm_calls import child_step_id

MODELS = {"openai": "openai:gpt-4o-mini", "responses": "openai-responses:gpt-4o-mini",
          "anthropic": "anthropic:claude-3-5-haiku-latest"}
PRICES = PriceTable({"gpt-4o-mini": Price(input=1.0, output=4.0),
                     "claude-3-5-haiku-latest": Price(input=0.8, output=4.0)})
TWO_CITIES = (Call("call_a", "lookup", '{"city": "Paris"}'), Call("call_b", "lookup", '{"city": "Lyon"}'))

pytestmark = pytest.mark.parametrize("dialect", list(MODELS))


def tool_results(req: RecordedRequest) -> list[tuple[str, str]]:
    """The tool results a request sends back, ``(call id, content)``, read from its body in its dialect's shape."""
    body = req.body
    if req.dialect == "anthropic":
        return [(b["tool_use_id"], b["content"]) for m in body["messages"] if m["role"] == "user"
                and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"]
    if req.dialect == "responses":
        return [(i["call_id"], i["output"]) for i in body["input"] if i.get("type") == "function_call_output"]
    return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]


def two_lookups_then_answer(req: RecordedRequest) -> Reply:
    if not tool_results(req):
        return Text("", tool_calls=TWO_CITIES, prompt_tokens=50, completion_tokens=20)
    return Text("Paris 21, Lyon 19.", prompt_tokens=90, completion_tokens=8)


class Lookups:
    """A weather lookup tool that records every call it really makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def lookup(self, city: str) -> dict[str, Any]:
        """Today's temperature in a city."""
        self.calls.append(city)
        return {"city": city, "temp": 21 if city == "Paris" else 19}


@asynccontextmanager
async def served(dialect: str, script: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    name = MODELS[dialect]
    server = ScriptedLLM(script)
    async with server as base_url, client_class(name)(name, base_url=base_url, api_key="k", prices=PRICES,
                                                       backoff=Backoff(attempts=2, base=0.01, cap=0.02)) as client:
        yield server, client


def toolbox(client: OpenAIChatClient, lookups: Lookups, budget: Budget | None = None) -> Toolbox:
    deploy_calls = lookups.calls

    async def deploy(target: str) -> str:
        """Deploy to a target."""
        deploy_calls.append(f"deploy {target}")
        return f"deployed {target}"

    return Toolbox({"llm": llm_tool(client, budget, prices=PRICES),
                    "lookup": Tool.from_function(lookups.lookup, name="lookup"),
                    "deploy": Tool.from_function(deploy, name="deploy")})


async def until(run: Run, kind: str, step: str | None = None) -> Event:
    async with asyncio.timeout(20):  # a missing event fails the test, not hangs it
        async for event in run.events():
            if event.kind == kind and (step is None or event.step == step):
                return event
    raise AssertionError(f"the run ended without a {kind} event")


async def test_two_parallel_tool_calls_run_as_their_own_steps_then_the_model_answers(dialect: str) -> None:
    lookups = Lookups()
    async with served(dialect, two_lookups_then_answer) as (server, client):
        plan = {"steps": [{"id": "ask", "tool": "llm",
                           "args": {"prompt": "Weather in Paris and Lyon?", "tools": ["lookup"]}}]}
        # concurrency 1: the llm step lends its slot while it waits, or its tool calls could never run
        async with open_engine("memory://", tools=toolbox(client, lookups), concurrency=1) as engine:
            run = await engine.start(plan)
            result = await asyncio.wait_for(run.wait(), 20)  # a deadlock fails, not hangs
            events = [e async for e in run.events()]
    assert result.ok, result.error
    out = result.outputs["ask"]
    assert out["text"] == "Paris 21, Lyon 19."
    assert out["rounds"] == 1
    assert out["tokens"] == {"prompt": 140, "completion": 28, "total": 168, "estimated": False}
    assert sorted(lookups.calls) == ["Lyon", "Paris"]
    children = {child_step_id("ask", "lookup", {"city": c}) for c in ("Paris", "Lyon")}
    assert {c["step"] for c in out["tool_calls"]} == children
    # each call is a step of the run: added by the llm step, started and succeeded with its own journal entries
    added = [e for e in events if e.kind == "steps_added"]
    assert {s["id"] if isinstance(s, dict) else s.id for e in added for s in e.data["steps"]} == children
    assert all(e.data["caller"] == "ask" for e in added)
    for child in children:
        assert [e.kind for e in events if e.step == child] == ["step_started", "step_succeeded"]
        assert result.outputs[child]["city"] in ("Paris", "Lyon")
    # both calls ran before the model was asked again (in parallel, in one round), then the results went back
    first_done = max(i for i, e in enumerate(events) if e.step in children and e.kind == "step_succeeded")
    model_calls = [i for i, e in enumerate(events) if e.kind == "model_call" and e.step == "ask"]
    assert len(model_calls) == 2 and model_calls[0] < first_done < model_calls[1]
    second = server.model_requests[1]
    assert sorted(tool_results(second)) == [("call_a", '{"city":"Paris","temp":21}'),
                                            ("call_b", '{"city":"Lyon","temp":19}')]
    if dialect == "anthropic":  # the calls echoed as tool_use blocks, the results in one user turn
        assert [b["type"] for b in second.body["messages"][1]["content"]] == ["tool_use", "tool_use"]
        assert len(second.body["messages"]) == 3
    elif dialect == "responses":  # the calls echoed as function_call items
        assert [(i.get("type"), i.get("call_id")) for i in second.body["input"][1:3]] == [
            ("function_call", "call_a"), ("function_call", "call_b")]
    else:
        assert [c["id"] for c in second.body["messages"][1]["tool_calls"]] == ["call_a", "call_b"]
    assert [t["function"]["name"] if dialect == "openai" else t["name"]
            for t in server.model_requests[0].body["tools"]] == ["lookup"]


async def test_every_round_is_reserved_and_settled_against_the_budget(dialect: str) -> None:
    lookups = Lookups()
    budget = Budget(usd=1.0, tokens=10_000)
    async with served(dialect, two_lookups_then_answer) as (_, client):
        tools = toolbox(client, lookups, budget)
        plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "Weather?", "tools": ["lookup"],
                                                                 "max_tokens": 100}}]}
        async with open_engine("memory://", tools=tools) as engine:
            run = await engine.start(plan)
            result = await asyncio.wait_for(run.wait(), 20)
            events = [e async for e in run.events()]
    assert result.ok, result.error
    reserved = [e.data["reservation"] for e in events if e.kind == "model_reserved"]
    settled = [e.data["reservation"] for e in events if e.kind == "model_call"]
    assert len(reserved) == 2 and settled == reserved  # each round's call reserved before it went out, settled
    assert budget.spent_tokens == 168 == result.outputs["ask"]["tokens"]["total"]
    assert budget.spent_usd == pytest.approx(result.outputs["ask"]["cost_usd"])
    assert budget.reserved_tokens == 0


async def test_a_tool_call_that_needs_approval_waits_for_it(dialect: str) -> None:
    def script(req: RecordedRequest) -> Reply:
        if not tool_results(req):
            return Text("", tool_calls=(Call("call_d", "deploy", '{"target": "prod"}'),))
        return Text(f"done: {tool_results(req)[0][1]}")

    lookups = Lookups()
    async with served(dialect, script) as (server, client):
        plan = {"steps": [{"id": "ship", "tool": "llm", "args": {
            "prompt": "Ship it.", "tools": [{"tool": "deploy", "approval": "Deploy to prod?", "timeout": 5}]}}]}
        async with open_engine("memory://", tools=toolbox(client, lookups), concurrency=1) as engine:
            run = await engine.start(plan)
            child = child_step_id("ship", "deploy", {"target": "prod"})
            asked = await until(run, "approval_requested", child)
            assert asked.data["prompt"] == "Deploy to prod?"
            assert lookups.calls == [] and len(server.model_requests) == 1  # nothing runs before the approval
            assert run.state.records["ship"].status == "running"
            await run.approve(child, by="ops")
            result = await run.wait()
    assert result.ok, result.error
    assert lookups.calls == ["deploy prod"]
    assert result.outputs["ship"]["text"] == "done: deployed prod"
    assert run.plan.steps[child].timeout == 5


async def test_a_resumed_llm_step_reuses_a_finished_tool_call(dialect: str, tmp_path: Path) -> None:
    """Interrupted while one call waits for approval and the other has finished: the resumed llm step asks the
    model again, gets the same calls, and runs only the unfinished one."""
    def script(req: RecordedRequest) -> Reply:
        if not tool_results(req):
            return Text("", tool_calls=(Call("call_l", "lookup", '{"city": "Paris"}'),
                                        Call("call_d", "deploy", '{"target": "prod"}')))
        return Text("both done")

    lookups = Lookups()
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"steps": [{"id": "ask", "tool": "llm", "args": {
        "prompt": "Look up and ship.", "tools": ["lookup", {"tool": "deploy", "approval": True}]}}]}
    looked = child_step_id("ask", "lookup", {"city": "Paris"})
    shipped = child_step_id("ask", "deploy", {"target": "prod"})
    async with served(dialect, script) as (server, client):
        async with open_engine(journal, tools=toolbox(client, lookups)) as engine:
            run = await engine.start(plan)
            await until(run, "step_succeeded", looked)
            await until(run, "approval_requested", shipped)
            engine.interrupt(run.id)
        assert lookups.calls == ["Paris"]
        async with open_engine(journal, tools=toolbox(client, lookups)) as engine:
            resumed = await engine.resume(run.id)
            await until(resumed, "approval_requested", shipped)
            await resumed.approve(shipped)
            result = await resumed.wait()
    assert result.ok, result.error
    assert lookups.calls == ["Paris", "deploy prod"]  # the lookup was not called again
    assert result.outputs["ask"]["text"] == "both done"
    assert len(server.model_requests) == 3  # the first turn, asked again on resume, the answer


async def test_arguments_the_tool_refuses_go_back_to_the_model_which_calls_again(dialect: str) -> None:
    def script(req: RecordedRequest) -> Reply:
        results = tool_results(req)
        if not results:
            return Text("", tool_calls=(Call("c1", "lookup", '{"town": "Paris"}'),))
        if len(results) == 1:
            return Text("", tool_calls=(Call("c2", "lookup", '{"city": "Paris"}'),))
        return Text("21")

    lookups = Lookups()
    async with served(dialect, script) as (server, client):
        plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "Paris?", "tools": ["lookup"]}}]}
        async with open_engine("memory://", tools=toolbox(client, lookups)) as engine:
            result = await asyncio.wait_for((await engine.start(plan)).wait(), 20)
    assert result.ok, result.error
    assert lookups.calls == ["Paris"]
    refused = tool_results(server.model_requests[1])[0][1]
    assert refused.startswith("error: ") and "city" in refused
    out = result.outputs["ask"]
    assert out["rounds"] == 2 and [c.get("error") for c in out["tool_calls"]] == ["invalid arguments", None]


async def test_a_rejected_tool_call_fails_the_llm_step_naming_it(dialect: str) -> None:
    def script(req: RecordedRequest) -> Reply:
        return Text("", tool_calls=(Call("c1", "deploy", '{"target": "prod"}'),))

    lookups = Lookups()
    async with served(dialect, script) as (server, client):
        # on_failure continue: the llm step sees its call fail (with the default, stop, the run stops at the call)
        plan = {"on_failure": "continue", "steps": [{"id": "ship", "tool": "llm", "args": {
            "prompt": "Ship.", "tools": [{"tool": "deploy", "approval": True}]}}]}
        async with open_engine("memory://", tools=toolbox(client, lookups)) as engine:
            run = await engine.start(plan)
            child = child_step_id("ship", "deploy", {"target": "prod"})
            await until(run, "approval_requested", child)
            await run.approve(child, False, "not today")
            result = await asyncio.wait_for(run.wait(), 20)
    assert not result.ok and lookups.calls == []
    error = result.state.records["ship"].error or ""
    assert f"tool call 'deploy' (step '{child}')" in error and "not today" in error
    assert result.state.records["ship"].error_kind == "tool_call"
    assert len(server.model_requests) == 1


async def test_an_unknown_tool_or_key_fails_before_the_model_is_called(dialect: str) -> None:
    lookups = Lookups()
    async with served(dialect, lambda req: Text("never")) as (server, client):
        plans: list[dict[str, Any]] = [{"tools": ["lookup", "nope"]}, {"tools": [{"tool": "lookup", "timeot": 3}]},
                 {"tools": [{"tool": "lookup", "timeout": -1}]}, {"tools": ["llm"]}]
        errors = []
        async with open_engine("memory://", tools=toolbox(client, lookups)) as engine:
            for args in plans:
                plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "x", **args}}]}
                result = await (await engine.start(plan)).wait()
                errors.append(result.state.records["ask"].error or "")
    assert "tools[1]: the run has no tool 'nope'" in errors[0]
    assert "unknown key(s) timeot" in errors[1]
    assert "tools[0] ('lookup')" in errors[2] and "timeout" in errors[2]
    assert "cannot offer the llm tool" in errors[3]
    assert server.model_requests == []


# -- a SIGKILLed process, resumed ------------------------------------------------------------------------------------
ROOT = str(Path(__file__).resolve().parents[2])


def append(path: str, line: str) -> None:
    with Path(path).open("a") as f:
        f.write(line + "\n")


def die_once(log: str, once: str) -> Tool:
    """A tool that logs its call and, the first time, SIGKILLs its own process (no await before: nothing of the call
    is journaled after its effect)."""
    def die(reason: str) -> str:
        """Stop here once."""
        append(log, f"die {reason}")
        if not Path(once).exists():
            Path(once).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return "survived"

    return Tool.from_function(die, name="die", idempotent=True)


async def child(dialect: str, base_url: str, journal: str, log: str, once: str, resume: str | None) -> None:
    """The killed process's program (run by the test in a subprocess): start the run, or resume ``resume``."""
    name = MODELS[dialect]
    async with client_class(name)(name, base_url=base_url, api_key="k", prices=PRICES) as client:
        def lookup(city: str) -> str:
            """Today's temperature in a city."""
            append(log, f"lookup {city}")
            return "21"

        tools = Toolbox({"llm": llm_tool(client), "lookup": Tool.from_function(lookup, name="lookup"),
                         "die": die_once(log, once)})
        plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "Go.", "tools": ["lookup", "die"]}}]}
        async with open_engine(journal, tools=tools) as engine:
            run = await (engine.resume(resume) if resume else engine.start(plan))
            result = await run.wait()
            print(json.dumps({"run": run.id, "ok": result.ok, "error": result.error,
                              "out": result.outputs.get("ask")}))


async def test_a_sigkilled_run_resumed_does_not_call_a_finished_tool_again(dialect: str, tmp_path: Path) -> None:
    if dialect != "anthropic":
        pytest.skip("two processes per dialect: one dialect here, the in-process resume above runs in all three")
    def script(req: RecordedRequest) -> Reply:
        done = len(tool_results(req))  # one call per round: look up, then die, then answer
        if done == 0:
            return Text("", tool_calls=(Call("c1", "lookup", '{"city": "Paris"}'),))
        if done == 1:
            return Text("", tool_calls=(Call("c2", "die", '{"reason": "test"}'),))
        return Text("all done")

    log, once, journal = tmp_path / "effects.log", tmp_path / "once", f"sqlite:///{tmp_path / 'runs.db'}"
    root = ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("PLANWEAVE_JOURNAL", None)

    async def program(base_url: str, resume: str | None) -> tuple[int, str]:
        code = (f"import asyncio, tests.tools.test_llm_tools as t; asyncio.run(t.child({dialect!r}, {base_url!r}, "
                f"{journal!r}, {str(log)!r}, {str(once)!r}, {resume!r}))")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=root, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode() + err.decode()

    async with ScriptedLLM(script) as base_url:
        code, output = await program(base_url, None)
        assert code == -signal.SIGKILL, output
        assert log.read_text().split("\n")[:2] == ["lookup Paris", "die test"]
        async with open_engine(journal) as engine:
            (run_id,) = await engine.journal.run_ids()
        code, output = await program(base_url, run_id)
    assert code == 0, output
    ended = json.loads(output.strip().splitlines()[-1])
    assert ended["ok"], ended
    assert ended["out"]["text"] == "all done"
    # the finished lookup was not called again; the killed call (idempotent, running at the kill) ran again
    assert log.read_text().split("\n") == ["lookup Paris", "die test", "die test", ""]
