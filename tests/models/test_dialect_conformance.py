"""One conformance suite, every dialect: Chat Completions, the Responses API and Anthropic Messages pass the same
scenarios against the scripted server — streaming with the server's usage and a cost from the price database,
tool calls streamed as argument deltas, structured output, cached and reasoning tokens, 429 retried after
Retry-After, a 5xx before the first token retried, a cut stream charged for what it sent, and a goal planned and run
through the CLI under a dollar budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from planweave.models import (
    Completion,
    CompletionRequest,
    Delta,
    ModelClient,
    ToolSpec,
    client_class,
    resolve_model,
    split_model,
)
from planweave.models.errors import ModelUnavailable, ProviderError, RateLimited
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.testing import (
    Call,
    Drop,
    HttpError,
    RecordedRequest,
    Reply,
    ScriptedLLM,
    StreamError,
    Text,
    plan_lines,
)
from planweave.testing.scripted_llm import split_tokens

MODELS = {"chat": "openai:gpt-4o-mini", "responses": "openai-responses:gpt-4o-mini",
          "anthropic": "anthropic:claude-3-5-haiku-latest"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
SCHEMA: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
                             "required": ["city", "n"]}
WEATHER = ToolSpec("weather", "today's weather in a city",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
FAST = Backoff(attempts=3, base=0.01, cap=0.02)

pytestmark = pytest.mark.parametrize("dialect", list(MODELS))


@asynccontextmanager
async def serve(dialect: str, script: Any, **options: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    server = ScriptedLLM(script)
    name = MODELS[dialect]
    async with server as base_url, client_class(name)(name, base_url=base_url, api_key="k",
                                                       backoff=options.pop("backoff", FAST), **options) as client:
        yield server, client


def database_cost(name: str, prompt: int, completion: int, cached: int = 0, written: int = 0) -> float:
    provider = {"anthropic": "anthropic"}.get(split_model(name)[0], "openai")
    price = calc_price(Usage(input_tokens=prompt, output_tokens=completion, cache_read_tokens=cached or None,
                             cache_write_tokens=written or None), split_model(name)[1], provider_id=provider)
    return float(price.total_price)


async def collect(client: ModelClient, request: CompletionRequest) -> tuple[list[Delta], Completion]:
    deltas: list[Delta] = []
    async with aclosing(client.stream(request)) as stream:
        async for item in stream:
            if isinstance(item, Delta):
                deltas.append(item)
            else:
                return deltas, item
    raise AssertionError("the stream ended without a Completion")


async def test_a_stream_gives_deltas_then_a_completion_with_server_usage_and_a_database_cost(dialect: str) -> None:
    async with serve(dialect, [Text("The weather in Oslo is mild today.")]) as (server, client):
        deltas, done = await collect(client, CompletionRequest.of("weather?", system="be brief", max_tokens=50))
    assert server.requests[0].path == PATHS[dialect]
    assert "".join(d.text for d in deltas) == done.text == "The weather in Oslo is mild today." and deltas
    served = server.served[0]
    assert (done.prompt_tokens, done.completion_tokens) == (served.prompt_tokens, served.completion_tokens)
    assert done.usage_source == "server" and done.finish_reason == "stop"
    assert done.cost_usd == pytest.approx(database_cost(MODELS[dialect], served.prompt_tokens,
                                                        served.completion_tokens))
    assert server.requests[0].messages[0] == {"role": "system", "content": "be brief"}


async def test_a_whole_reply_has_its_usage_and_cost(dialect: str) -> None:
    async with serve(dialect, [Text("mild")]) as (server, client):
        done = await client.complete(CompletionRequest.of("weather?", max_tokens=20))
    served = server.served[0]
    assert done.text == "mild" and done.completion_tokens == served.completion_tokens and done.cost_usd is not None


async def test_tool_calls_stream_as_argument_deltas_and_end_parsed(dialect: str) -> None:
    args = '{"city": "Oslo", "unit": "celsius"}'
    async with serve(dialect, [Text("Let me look.", tool_calls=(Call("call_7", "weather", args),))]) as (
            server, client):
        deltas, done = await collect(client, CompletionRequest.of("weather in Oslo?", tools=(WEATHER,),
                                                                  tool_choice="required"))
    pieces = [d.tool_call for d in deltas if d.tool_call is not None]
    assert pieces[0].name == "weather" and pieces[0].id == "call_7" and len(pieces) > 3
    assert all(p.name is None for p in pieces[1:]) and "".join(p.arguments for p in pieces) == args
    assert done.text == "Let me look." and done.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.parsed_arguments()) for c in done.tool_calls] == [
        ("call_7", "weather", {"city": "Oslo", "unit": "celsius"})]
    body = server.requests[0].body
    sent = body["tools"][0]
    assert (sent.get("function") or sent)["name"] == "weather"  # chat nests it under "function"
    assert body["tool_choice"] in ("required", {"type": "any"})


async def test_structured_output_is_asked_in_the_dialects_own_way_and_parsed(dialect: str) -> None:
    async with serve(dialect, [Text(json.dumps({"city": "Oslo", "n": 3}))] * 2) as (server, client):
        done = await client.complete(CompletionRequest.of("city?", schema=SCHEMA, schema_name="answer"))
        _, streamed = await collect(client, CompletionRequest.of("city?", schema=SCHEMA, schema_name="answer"))
    assert done.parsed == streamed.parsed == {"city": "Oslo", "n": 3} and done.tool_calls == streamed.tool_calls == ()
    body = server.requests[0].body
    if dialect == "chat":
        assert done.structured_mode == "json_schema" and body["response_format"]["json_schema"]["name"] == "answer"
    elif dialect == "responses":
        assert done.structured_mode == "json_schema" and body["text"]["format"]["schema"] == SCHEMA
    else:
        assert done.structured_mode == "tool" and body["tool_choice"] == {"type": "tool", "name": "answer"}
        assert done.finish_reason == streamed.finish_reason == "stop"


async def test_cached_and_reasoning_tokens_are_counted_and_priced(dialect: str) -> None:
    written = 5 if dialect == "anthropic" else 0  # only Anthropic reports cache writes
    reply = Text("Oslo.", reasoning="The user asked about Oslo, so Oslo.", prompt_tokens=400, cached_tokens=300,
                 cache_write_tokens=written)
    async with serve(dialect, [reply, reply]) as (_, client):
        _, streamed = await collect(client, CompletionRequest.of("weather?"))
        whole = await client.complete(CompletionRequest.of("weather?"))
    for done in (streamed, whole):
        assert done.prompt_tokens == 400 and done.cached_tokens == 300 and done.cache_write_tokens == written
        assert done.reasoning == "The user asked about Oslo, so Oslo."
        thought = len(split_tokens("The user asked about Oslo, so Oslo."))
        assert done.reasoning_tokens == (None if dialect == "anthropic" else thought)  # Anthropic does not say
        assert done.cost_usd == pytest.approx(database_cost(MODELS[dialect], 400, done.completion_tokens, 300,
                                                            written))
    uncached = database_cost(MODELS[dialect], 400, streamed.completion_tokens)
    assert streamed.cost_usd is not None and streamed.cost_usd < uncached


async def test_a_429_is_retried_after_its_retry_after(dialect: str) -> None:
    async with serve(dialect, [HttpError(429, "slow down", retry_after=0.2), Text("ok")]) as (server, client):
        started = time.monotonic()
        _, done = await collect(client, CompletionRequest.of("hi"))
        waited = time.monotonic() - started
    assert done.text == "ok" and [c.status for c in server.served] == [429, 200] and waited >= 0.2


async def test_a_429_asking_too_long_a_wait_is_raised_with_it(dialect: str) -> None:
    async with serve(dialect, [HttpError(429, retry_after=120)]) as (_, client):
        with pytest.raises(RateLimited) as info:
            await client.complete(CompletionRequest.of("hi"))
    assert info.value.retry_after == 120


async def test_a_5xx_before_the_first_token_is_retried(dialect: str) -> None:
    async with serve(dialect, [HttpError(503), Drop(""), Text("ok")]) as (server, client):
        _, done = await collect(client, CompletionRequest.of("hi"))
    assert done.text == "ok" and len(server.served) == 3


async def test_a_cut_stream_raises_and_its_last_delta_carries_what_it_cost(dialect: str) -> None:
    text = "one two three four five six seven eight nine ten"
    async with serve(dialect, [Drop(text)]) as (server, client):
        deltas: list[Delta] = []
        with pytest.raises(ModelUnavailable):
            async with aclosing(client.stream(CompletionRequest.of("count"))) as stream:
                async for item in stream:
                    assert isinstance(item, Delta)
                    deltas.append(item)
    assert "".join(d.text for d in deltas) == text
    last = deltas[-1].usage
    served = server.served[0]
    assert last is not None and last.prompt_tokens == served.prompt_tokens
    # charged at least what the server billed, never nothing (Anthropic's message_start counts one output token
    # before the text, as the real API does: one more at most)
    assert served.completion_tokens <= last.completion_tokens <= served.completion_tokens + 1


async def test_an_error_event_mid_stream_is_raised_after_the_text_it_followed(dialect: str) -> None:
    async with serve(dialect, [StreamError("some text then", 500, "boom")]) as (server, client):
        deltas: list[Delta] = []
        with pytest.raises(ProviderError, match="error in stream") as info:
            async with aclosing(client.stream(CompletionRequest.of("hi"))) as stream:
                async for item in stream:
                    assert isinstance(item, Delta)
                    deltas.append(item)
    assert "".join(d.text for d in deltas) == "some text then" and len(server.served) == 1  # not retried
    assert "boom" in str(info.value)


# -- through the CLI: a goal planned and run in each dialect, under a dollar budget --------------------------------
def goal_script(req: RecordedRequest) -> Reply:
    prompt = str(req.messages[-1]["content"])
    if "If the results answer the goal" in prompt:
        return Text(json.dumps({"answer": "Oslo is mild"}))
    if "Summarise the weather" in prompt:
        return Text("Mild and dry.")
    return Text(plan_lines([{"id": "ask", "tool": "llm", "args": {"prompt": "Summarise the weather in Oslo",
                                                                   "max_tokens": 50}}]))


async def planweave(*args: str, cwd: Path) -> tuple[int, str, str]:
    env = {**os.environ, "OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_a_goal_is_planned_and_run_through_the_cli_under_a_dollar_budget(dialect: str, tmp_path: Path) -> None:
    server = ScriptedLLM(goal_script)
    async with server as base_url:
        code, out, err = await planweave(
            "run", "--goal", "What is the weather in Oslo?", "--model", MODELS[dialect], "--base-url", base_url,
            "--budget-usd", "0.05", "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json", cwd=tmp_path)
    assert code == 0, err
    result = json.loads(out)
    assert result["answer"] == "Oslo is mild"
    assert {r.path for r in server.requests} == {PATHS[dialect]}  # planner, step and joiner: all in the dialect
    served = [c for c in server.served if c.status == 200]
    expected = sum(database_cost(MODELS[dialect], c.prompt_tokens, c.completion_tokens) for c in served)
    assert len(served) >= 3
    assert result["cost_usd"] == pytest.approx(expected, rel=1e-6)  # every call, priced by the database


async def test_a_goal_whose_budget_cannot_cover_the_planner_is_refused_before_any_call(dialect: str,
                                                                                tmp_path: Path) -> None:
    server = ScriptedLLM(goal_script)
    async with server as base_url:
        code, out, _ = await planweave(
            "run", "--goal", "What is the weather in Oslo?", "--model", MODELS[dialect], "--base-url", base_url,
            "--budget-usd", "0.0000001", "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json", cwd=tmp_path)
    assert code != 0 and "stopped by its budget" in json.loads(out)["error"]
    assert server.served == []  # refused before the planner's call: its worst case does not fit


async def test_resolve_model_opens_the_dialects_client(dialect: str) -> None:
    async with ScriptedLLM([Text("hi")]) as base_url:
        from planweave.models import Endpoint

        async with resolve_model(MODELS[dialect], endpoint=Endpoint(base_url, api_key="k")) as client:
            assert type(client) is client_class(MODELS[dialect]) and client.model == MODELS[dialect]
            done = await client.complete(CompletionRequest.of("hello"))
    assert done.text == "hi"


async def test_a_goal_posted_over_http_is_planned_and_run_in_the_dialect_under_a_dollar_budget(
        dialect: str, tmp_path: Path) -> None:
    from planweave import open_engine
    from planweave.models import Endpoint
    from planweave.server import LiveServer, create_app
    from planweave.server.limits import open_server_model
    from planweave.tools.safety import SecretRedactor
    from tests.server.conftest import TOKEN, Live, RunTracker

    server = ScriptedLLM(goal_script)
    async with server as base_url, contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(open_engine(f"sqlite:///{tmp_path / 'runs.db'}",
                                                             redact=SecretRedactor()))
        tracker = RunTracker(engine)
        model = await open_server_model(stack, engine, MODELS[dialect], base_url,
                                        endpoint=Endpoint(base_url, api_key="k"))
        app = await stack.enter_async_context(LiveServer(create_app(engine, TOKEN, model=model), "127.0.0.1", 0,
                                                         log_config=None))
        live = Live(app, engine, "", TOKEN, tracker)
        async with live.client() as client:
            posted = await client.post("/runs", json={"goal": "What is the weather in Oslo?", "budget_usd": 0.05})
            assert posted.status_code == 201, posted.text
            report = await live.finished(client, posted.json()["run_id"])
    assert report["status"] == "succeeded" and report["answer"] == "Oslo is mild"
    assert {r.path for r in server.requests} == {PATHS[dialect]}
    served = [c for c in server.served if c.status == 200]
    assert len(served) >= 3
    assert report["cost_usd"] == pytest.approx(
        sum(database_cost(MODELS[dialect], c.prompt_tokens, c.completion_tokens) for c in served), rel=1e-6)


async def test_a_request_naming_another_dialects_model_is_sent_in_that_dialect(dialect: str) -> None:
    others = [d for d in MODELS if d != dialect]
    async with serve(dialect, [Text("mine"), Text("first other"), Text("second other"), Text("bare")]) as (
            server, client):
        mine = await client.complete(CompletionRequest.of("to my dialect"))
        streamed = [await collect(client, CompletionRequest.of("to another", model=MODELS[d])) for d in others]
        bare = await client.complete(CompletionRequest.of("a bare name", model=split_model(MODELS[dialect])[1]))
    assert [r.path for r in server.requests] == [PATHS[dialect], *(PATHS[d] for d in others), PATHS[dialect]]
    assert [mine.text, *(c.text for _, c in streamed), bare.text] == ["mine", "first other", "second other", "bare"]
    assert all(c.cost_usd is not None for _, c in streamed)  # priced as their own models
    assert {r.headers.get("x-api-key") or r.headers.get("authorization") for r in server.requests} <= {"k",
                                                                                                     "Bearer k"}


async def test_a_plan_whose_steps_name_models_of_the_three_dialects_runs_each_in_its_own(dialect: str,
                                                                                         tmp_path: Path) -> None:
    server = ScriptedLLM(lambda req: Text(f"answered in {req.dialect}"))
    steps = [{"id": d, "tool": "llm", "args": {"prompt": f"for {d}", "model": MODELS[d], "max_tokens": 20}}
             for d in MODELS]
    (tmp_path / "plan.json").write_text(json.dumps({"steps": steps}))
    async with server as base_url:
        code, out, err = await planweave(
            "run", "plan.json", "--model", MODELS[dialect], "--base-url", base_url, "--budget-usd", "0.05",
            "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json", cwd=tmp_path)
    assert code == 0, err
    outputs = json.loads(out)["outputs"]
    assert {d: outputs[d]["text"] for d in MODELS} == {d: f"answered in {d}" for d in MODELS}
    assert sorted(r.path for r in server.requests) == sorted(PATHS.values())
    assert all(outputs[d]["cost_usd"] > 0 for d in MODELS)


async def test_a_cascade_escalates_from_one_dialect_to_another(dialect: str, tmp_path: Path) -> None:
    small, large = MODELS[dialect], MODELS[next(d for d in MODELS if d != dialect)]
    tiers = {"small": {"model": small, "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
             "large": {"model": large, "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001}}
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    step = {"id": "a", "tool": "llm", "retries": 2, "args": {"prompt": "a?", "model": "cascade",
                                                              "tiers": ["large", "small"], "schema": schema,
                                                              "max_tokens": 20}}
    (tmp_path / "plan.json").write_text(json.dumps({"steps": [step]}))
    (tmp_path / "tiers.json").write_text(json.dumps(tiers))
    large_path = PATHS[split_model(large)[0]]
    server = ScriptedLLM(lambda req: Text('{"answer": "yes"}' if req.path == large_path else '{"nope": 1}'))
    async with server as base_url:
        code, out, err = await planweave(
            "run", "plan.json", "--model", small, "--base-url", base_url, "--config", "tiers=tiers.json",
            "--budget-usd", "0.05", "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json", cwd=tmp_path)
    assert code == 0, err
    assert [r.path for r in server.requests] == [PATHS[dialect], large_path]  # the small tier first, then up
    output = json.loads(out)["outputs"]["a"]
    assert output["json"] == {"answer": "yes"}, output
