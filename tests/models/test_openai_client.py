"""The OpenAI-compatible client against the scripted server, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from planweave.core.errors import PlanweaveError
from planweave.models import Completion, CompletionRequest, Delta, ModelClient
from planweave.models.errors import (
    MalformedOutput,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
    RateLimited,
)
from planweave.models.openai import Backoff, OpenAIChatClient, Timeouts, parse_retry_after, reset_server_compat
from planweave.models.pricing import Price, PriceTable
from planweave.testing import Drop, HttpError, RecordedRequest, Reply, ScriptedLLM, Stall, Text, plan_lines
from planweave.testing.scripted_llm import load_script, split_tokens

KEY = "sk-test-secret-key-0123456789"
FAST = Backoff(attempts=3, base=0.01, cap=0.02)
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "n": {"type": "integer"}},
    "required": ["title", "n"],
}


@pytest.fixture(autouse=True)
def _fresh_compat() -> Iterator[None]:
    reset_server_compat()  # servers of earlier tests may have had this port
    yield
    reset_server_compat()


@asynccontextmanager
async def serve(script: Any = (), **options: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    client_options = {k: options.pop(k) for k in ("timeouts", "backoff", "concurrency", "prices") if k in options}
    client_options.setdefault("backoff", FAST)
    server = ScriptedLLM(script, **options)
    async with server as base_url, OpenAIChatClient("gpt-4o-mini", base_url=base_url, api_key=KEY,
                                                    **client_options) as client:
        yield server, client


async def collect(client: ModelClient, request: CompletionRequest) -> tuple[list[str], Completion]:
    deltas: list[str] = []
    async with aclosing(client.stream(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, Delta):
                deltas.append(chunk.text)
            else:
                return deltas, chunk
    raise AssertionError("the stream ended without a completion")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- text, usage, cost -------------------------------------------------------------------------------------------------
async def test_client_satisfies_the_model_client_protocol() -> None:
    async with OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1", api_key="") as client:
        assert isinstance(client, ModelClient)
        assert client.model == "m"


async def test_stream_yields_deltas_then_one_completion_with_server_usage() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    async with serve([Text(text)]) as (server, client):
        deltas, completion = await collect(client, CompletionRequest.of("say it", system="be brief"))
    assert "".join(deltas) == completion.text == text
    assert completion.usage_source == "server"
    assert completion.completion_tokens == len(split_tokens(text))
    assert completion.finish_reason == "stop"
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say it"}]
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_complete_returns_text_usage_and_cost_from_the_price_table() -> None:
    prices = PriceTable({"gpt-4o-mini": Price(input=1.0, output=2.0)})
    async with serve([Text("hello", prompt_tokens=1000, completion_tokens=500)], prices=prices) as (server, client):
        completion = await client.complete(CompletionRequest.of("hi", max_tokens=50, temperature=0.2))
    assert completion.text == "hello"
    assert (completion.prompt_tokens, completion.completion_tokens) == (1000, 500)
    assert completion.cost_usd == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)
    body = server.requests[0].body
    assert "stream" not in body
    assert body["max_tokens"] == 50
    assert body["temperature"] == 0.2


async def test_usage_is_estimated_at_four_characters_per_token_when_the_server_sends_none() -> None:
    async with serve([Text("x" * 40, usage=False), Text("y" * 8, usage=False)]) as (_, client):
        _, streamed = await collect(client, CompletionRequest.of("p" * 20))
        completed = await client.complete(CompletionRequest.of("p" * 20))
    assert streamed.usage_source == completed.usage_source == "estimated"
    assert streamed.completion_tokens == 10
    assert completed.completion_tokens == 2
    assert streamed.prompt_tokens == completed.prompt_tokens == 5 + 4 + 2


async def test_unknown_model_has_no_cost() -> None:
    async with serve([Text("hi")]) as (_, client):
        completion = await client.complete(CompletionRequest.of("x", model="mystery-model"))
    assert completion.model == "mystery-model"
    assert completion.cost_usd is None


async def test_time_to_first_token_and_tokens_per_second_are_honoured() -> None:
    text = "a" * 4 * 20  # 20 tokens
    async with serve([Text(text, ttft=0.2, tokens_per_second=100)]) as (_, client):
        _, completion = await collect(client, CompletionRequest.of("go"))
    assert completion.first_token_s is not None
    assert 0.2 <= completion.first_token_s < 0.5
    assert 0.2 + 0.19 <= completion.duration_s < 0.9


# -- retries -----------------------------------------------------------------------------------------------------------
async def test_rate_limit_waits_for_retry_after_then_succeeds() -> None:
    async with serve([HttpError(429, "slow down", retry_after=1), Text("ok")]) as (server, client):
        completion = await client.complete(CompletionRequest.of("x"))
    assert completion.text == "ok"
    first, second = server.chat_requests
    waited = second.at - first.at
    assert 1.0 <= waited < 1.5, f"waited {waited:.3f}s for Retry-After: 1"


async def test_rate_limit_with_a_retry_after_beyond_the_limit_is_raised_at_once() -> None:
    async with serve([HttpError(429, retry_after=120), Text("never")]) as (server, client):
        with pytest.raises(RateLimited) as info:
            await client.complete(CompletionRequest.of("x"))
    assert info.value.retry_after == 120
    assert len(server.chat_requests) == 1


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


async def test_server_error_then_success_is_retried() -> None:
    async with serve([HttpError(500, "boom"), Text("ok")]) as (server, client):
        _, completion = await collect(client, CompletionRequest.of("x"))
    assert completion.text == "ok"
    assert len(server.chat_requests) == 2


async def test_persistent_server_errors_stop_after_the_bounded_attempts() -> None:
    async with serve([HttpError(503, "down")] * 5) as (server, client):
        with pytest.raises(ProviderError) as info:
            await client.complete(CompletionRequest.of("x"))
    assert len(server.chat_requests) == FAST.attempts
    assert info.value.status == 503
    assert info.value.retryable
    message = str(info.value)
    assert "gpt-4o-mini" in message and client.base_url in message and "down" in message


async def test_client_errors_are_not_retried() -> None:
    async with serve([HttpError(400, "bad request"), Text("never")]) as (server, client):
        with pytest.raises(ProviderError) as info:
            await client.complete(CompletionRequest.of("x"))
    assert info.value.status == 400
    assert not info.value.retryable
    assert len(server.chat_requests) == 1


async def test_error_messages_never_contain_the_api_key() -> None:
    async with serve([HttpError(401, f"invalid key {KEY}")] * 3) as (_, client):
        with pytest.raises(ModelError) as info:
            await client.complete(CompletionRequest.of("x"))
    assert KEY not in str(info.value) and KEY not in repr(info.value.args)


# -- timeouts and broken connections ---------------------------------------------------------------------------------
async def test_a_stream_that_stalls_mid_way_raises_model_timeout() -> None:
    timeouts = Timeouts(connect=1, read=5, stall=0.3)
    async with serve([Stall(after="partial answer")], timeouts=timeouts) as (server, client):
        got: list[str] = []
        started = time.monotonic()
        with pytest.raises(ModelTimeout) as info:
            async for chunk in client.stream(CompletionRequest.of("x")):
                assert isinstance(chunk, Delta)
                got.append(chunk.text)
        elapsed = time.monotonic() - started
    assert "".join(got) == "partial answer"
    assert "stalled" in str(info.value)
    assert 0.3 <= elapsed < 2.0
    assert len(server.chat_requests) == 1  # text was handed out: no silent retry


async def test_a_stream_that_stalls_before_any_text_is_retried() -> None:
    timeouts = Timeouts(connect=1, read=0.3, stall=0.3)
    async with serve([Stall(), Text("ok")], timeouts=timeouts) as (server, client):
        _, completion = await collect(client, CompletionRequest.of("x"))
    assert completion.text == "ok"
    assert len(server.chat_requests) == 2


async def test_a_stalled_non_streaming_call_times_out() -> None:
    timeouts = Timeouts(connect=1, read=0.2, stall=0.2)
    async with serve([Stall()] * 3, timeouts=timeouts, backoff=Backoff(attempts=2, base=0.01)) as (server, client):
        with pytest.raises(ModelTimeout):
            await client.complete(CompletionRequest.of("x"))
    assert len(server.chat_requests) == 2


async def test_a_connection_dropped_mid_stream_raises_model_unavailable() -> None:
    async with serve([Drop(after="half of it")]) as (_, client):
        with pytest.raises(ModelUnavailable) as info:
            await collect(client, CompletionRequest.of("x"))
    assert "dropped" in str(info.value)


async def test_a_connection_dropped_before_the_response_is_retried() -> None:
    async with serve([Drop(), Text("ok")]) as (server, client):
        completion = await client.complete(CompletionRequest.of("x"))
    assert completion.text == "ok"
    assert len(server.chat_requests) == 2


async def test_connection_refused_raises_model_unavailable_naming_the_url() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    async with OpenAIChatClient("gpt-4o-mini", base_url=base_url, api_key=KEY, backoff=FAST) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(CompletionRequest.of("x"))
        with pytest.raises(ModelUnavailable):
            await collect(client, CompletionRequest.of("x"))
    assert base_url in str(info.value)
    assert "gpt-4o-mini" in str(info.value)
    assert isinstance(info.value, PlanweaveError)


# -- structured output -------------------------------------------------------------------------------------------------
async def test_structured_output_asks_for_json_schema_and_parses_the_reply() -> None:
    async with serve([Text('{"title": "t", "n": 3}')]) as (server, client):
        completion = await client.complete(CompletionRequest.of("x", schema=SCHEMA, schema_name="thing"))
    assert completion.parsed == {"title": "t", "n": 3}
    assert completion.structured_mode == "json_schema"
    assert server.requests[0].response_format == {
        "type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA},
    }


async def test_json_schema_falls_back_to_json_object_when_the_server_answers_500() -> None:
    replies = [Text('{"title": "a", "n": 1}'), Text('{"title": "b", "n": 2}')]
    async with serve(replies, json_schema=False) as (server, client):
        _, first = await collect(client, CompletionRequest.of("x", schema=SCHEMA))
        second = await client.complete(CompletionRequest.of("y", schema=SCHEMA))
    assert first.parsed == {"title": "a", "n": 1} and second.parsed == {"title": "b", "n": 2}
    assert first.structured_mode == second.structured_mode == "json_object"
    formats = [r.response_format["type"] for r in server.chat_requests]
    assert formats == ["json_schema", "json_object", "json_object"]  # the choice is remembered for the base URL
    assert server.chat_requests[1].response_format["schema"] == SCHEMA
    assert "JSON schema" in server.chat_requests[1].messages[-1]["content"]


async def test_falls_back_to_the_prompt_when_no_response_format_is_accepted() -> None:
    def script(request: RecordedRequest) -> Reply:
        if request.response_format is not None:
            return HttpError(400, f"response_format {request.response_format['type']} is not supported")
        return Text('```json\n{"title": "t", "n": 1}\n```')

    async with serve(script) as (server, client):
        completion = await client.complete(CompletionRequest.of("x", schema=SCHEMA))
    assert completion.parsed == {"title": "t", "n": 1}
    assert completion.structured_mode == "prompt"
    assert len(server.chat_requests) == 3
    assert server.chat_requests[-1].response_format is None
    assert '"maxLength":40' in server.chat_requests[-1].messages[-1]["content"]


async def test_concurrent_calls_step_down_only_one_level_together() -> None:
    async with serve(lambda r: Text('{"title": "t", "n": 1}'), json_schema=False) as (_, client):
        results = await asyncio.gather(*(client.complete(CompletionRequest.of("x", schema=SCHEMA)) for _ in range(4)))
    assert {r.structured_mode for r in results} == {"json_object"}
    assert client.compat.structured == "json_object"


async def test_json_with_prose_around_it_is_accepted() -> None:
    async with serve([Text('Sure! Here it is: {"title": "t", "n": 2} Hope that helps.')]) as (_, client):
        completion = await client.complete(CompletionRequest.of("x", schema=SCHEMA))
    assert completion.parsed == {"title": "t", "n": 2}


async def test_an_invalid_schema_is_refused_before_sending() -> None:
    async with serve([Text("never")]) as (server, client):
        with pytest.raises(ValueError, match="not a valid JSON schema"):
            await client.complete(CompletionRequest.of("x", schema={"type": "thing"}))
    assert server.requests == []


async def test_malformed_json_from_the_model_is_a_clear_error() -> None:
    async with serve([Text('{"title": "t", "n": '), Text('{"title": "t"}')]) as (_, client):
        with pytest.raises(MalformedOutput) as info:
            await client.complete(CompletionRequest.of("x", schema=SCHEMA))
        assert "not valid JSON" in str(info.value) and "gpt-4o-mini" in str(info.value)
        assert info.value.text == '{"title": "t", "n": '
        with pytest.raises(MalformedOutput) as info:
            await collect(client, CompletionRequest.of("x", schema=SCHEMA))
        assert "does not match the schema" in str(info.value) and "'n' is a required property" in str(info.value)


async def test_a_reply_cut_at_max_tokens_says_so() -> None:
    async with serve([Text('{"title": "aaaa', finish_reason="length")]) as (_, client):
        with pytest.raises(MalformedOutput, match="cut at max_tokens"):
            await client.complete(CompletionRequest.of("x", schema=SCHEMA, max_tokens=5))


# -- adapting to the server -------------------------------------------------------------------------------------------
async def test_stream_options_are_dropped_for_a_server_that_rejects_them() -> None:
    def script(request: RecordedRequest) -> Reply:
        if "stream_options" in request.body:
            return HttpError(400, "Unrecognized request argument supplied: stream_options")
        return Text("hello world")

    async with serve(script) as (server, client):
        _, completion = await collect(client, CompletionRequest.of("x"))
        _, again = await collect(client, CompletionRequest.of("x"))
    assert completion.text == again.text == "hello world"
    assert completion.usage_source == "estimated"
    assert len(server.chat_requests) == 3


async def test_max_completion_tokens_is_used_for_a_server_that_asks_for_it() -> None:
    def script(request: RecordedRequest) -> Reply:
        if "max_tokens" in request.body:
            return HttpError(400, "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead.")
        return Text("ok")

    async with serve(script) as (server, client):
        await client.complete(CompletionRequest.of("x", max_tokens=7))
    assert server.chat_requests[-1].body["max_completion_tokens"] == 7


# -- configuration ---------------------------------------------------------------------------------------------------
async def test_base_url_and_key_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ScriptedLLM([Text("ok")])
    async with server as base_url:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url + "/")
        monkeypatch.setenv("OPENAI_API_KEY", "env-key")
        async with OpenAIChatClient("gpt-4o-mini") as client:
            assert client.base_url == base_url
            await client.complete(CompletionRequest.of("x"))
    assert server.requests[0].headers["authorization"] == "Bearer env-key"
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert OpenAIChatClient("m").base_url == "https://api.openai.com/v1"


async def test_concurrency_is_limited_per_model() -> None:
    in_flight: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def script(request: RecordedRequest) -> Reply:
        model = request.body["model"]
        in_flight[model] = in_flight.get(model, 0) + 1
        peak[model] = max(peak.get(model, 0), in_flight[model])
        await asyncio.sleep(0.05)
        in_flight[model] -= 1
        return Text("ok")

    async with serve(script, concurrency={"gpt-4o-mini": 2, "*": 3}) as (_, client):
        calls = [client.complete(CompletionRequest.of("x")) for _ in range(6)]
        calls += [client.complete(CompletionRequest.of("x", model="other")) for _ in range(6)]
        await asyncio.gather(*calls)
        assert client.concurrency_limit("gpt-4o-mini") == 2 and client.concurrency_limit("other") == 3
    assert peak == {"gpt-4o-mini": 2, "other": 3}


# -- the scripted server itself --------------------------------------------------------------------------------------
async def test_scripted_server_lists_models_and_reports_an_exhausted_script() -> None:
    server = ScriptedLLM([], models=("a", "b"))
    async with server as base_url, httpx.AsyncClient() as http:
        models = (await http.get(f"{base_url}/models")).json()
        assert [m["id"] for m in models["data"]] == ["a", "b"]
        response = await http.post(f"{base_url}/chat/completions", json={"model": "a", "messages": []})
        assert response.status_code == 410
        assert "no reply left" in response.json()["error"]["message"]


async def test_scripted_server_streams_sse_like_the_real_api() -> None:
    server = ScriptedLLM([Text(plan_lines([{"id": "a", "tool": "noop"}]))])
    body = {"model": "m", "messages": [{"role": "user", "content": "plan"}], "stream": True,
            "stream_options": {"include_usage": True}}
    async with server as base_url, httpx.AsyncClient() as http:
        response = await http.post(f"{base_url}/chat/completions", json=body)
    lines = [line for line in response.text.split("\n") if line]
    assert response.headers["content-type"] == "text/event-stream"
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(events) - 3
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert json.loads(text.strip()) == {"id": "a", "tool": "noop"}


def test_scripted_server_runs_from_the_command_line(tmp_path: Path) -> None:
    script = tmp_path / "replies.jsonl"
    script.write_text('{"text": "hello"}\n# a comment\n{"status": 429, "retry_after": 1}\n{"json": {"a": 1}}\n')
    assert [type(r).__name__ for r in load_script(script)] == ["Text", "HttpError", "Text"]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "planweave.testing.scripted_llm", "--port", str(port), "--script", str(script)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}/v1" in line
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=5)
        assert reply.json()["choices"][0]["message"]["content"] == "hello"
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=5).status_code == 429
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
