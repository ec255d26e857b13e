"""The scripted server is faithful to the three APIs it fakes: the official SDKs (PyPI ``openai``, ``anthropic``) are
its clients and parse every scenario — streamed and whole replies with usage, tool calls streamed as argument
deltas, structured output, reasoning, cached tokens, 429 with Retry-After, a cut stream."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from planweave.testing import Call, Drop, HttpError, ScriptedLLM, StreamError, Text
from planweave.testing.scripted_llm import reply_from_json, split_tokens

SCHEMA: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["city", "n"], "additionalProperties": False}
WEATHER: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ARGS = '{"city": "Oslo", "days": [1, 2, 3]}'


@asynccontextmanager
async def serve(*replies: Any) -> AsyncIterator[tuple[ScriptedLLM, openai.AsyncOpenAI, anthropic.AsyncAnthropic]]:
    server = ScriptedLLM(list(replies))
    async with server as base_url:
        root = base_url.removesuffix("/v1")
        async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as oa, \
                anthropic.AsyncAnthropic(base_url=root, api_key="k", max_retries=0) as an:
            yield server, oa, an


# -- Chat Completions -------------------------------------------------------------------------------------------------
async def test_chat_stream_with_usage_and_a_streamed_tool_call_parse_with_the_openai_sdk() -> None:
    reply = Text("Looking it up.", tool_calls=(Call("call_1", "weather", ARGS),), cached_tokens=3)
    async with serve(reply) as (server, oa, _):
        stream = await oa.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "weather in Oslo?"}], stream=True,
            stream_options={"include_usage": True},
            tools=[{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}])
        text, args, names, finish, usage = "", "", [], None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or ():
                    names += [call.function.name] if call.function and call.function.name else []
                    args += call.function.arguments or "" if call.function else ""
                finish = choice.finish_reason or finish
    assert text == "Looking it up." and names == ["weather"] and json.loads(args) == json.loads(ARGS)
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens == server.served[0].completion_tokens > 10
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 3


async def test_chat_structured_output_parses_with_the_openai_sdk() -> None:
    async with serve(Text(json.dumps({"city": "Oslo", "n": 3}))) as (server, oa, _):
        done = await oa.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "city?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "result", "schema": SCHEMA}})
    assert json.loads(done.choices[0].message.content or "") == {"city": "Oslo", "n": 3}
    assert done.usage is not None and done.usage.completion_tokens > 0
    assert server.requests[0].response_format["type"] == "json_schema"


# -- the Responses API ------------------------------------------------------------------------------------------------
async def test_responses_stream_with_reasoning_text_tool_call_and_usage_parses_with_the_openai_sdk() -> None:
    reply = Text("Checking.", reasoning="The user wants Oslo.", tool_calls=(Call("call_9", "weather", ARGS),),
                 cached_tokens=4)
    async with serve(reply) as (server, oa, _), oa.responses.stream(
            model="gpt-5-mini", input="weather in Oslo?",
            tools=[{"type": "function", "name": "weather", "parameters": WEATHER, "strict": False}]) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.function_call_arguments.delta"]
        final = await stream.get_final_response()
    assert final.output_text == "Checking." and final.status == "completed"
    kinds = [item.type for item in final.output]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning, call = final.output[0], final.output[2]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "The user wants Oslo."
    assert call.type == "function_call" and call.name == "weather" and json.loads(call.arguments) == json.loads(ARGS)
    assert len(deltas) > 3 and "".join(deltas) == ARGS  # the arguments came in pieces
    usage = final.usage
    assert usage is not None and usage.input_tokens_details.cached_tokens == 4
    assert usage.output_tokens_details.reasoning_tokens == len(split_tokens("The user wants Oslo."))
    assert usage.output_tokens == server.served[0].completion_tokens


async def test_responses_structured_output_and_a_whole_reply_parse_with_the_openai_sdk() -> None:
    async with serve(Text(json.dumps({"city": "Oslo", "n": 3}))) as (server, oa, _):
        done = await oa.responses.create(
            model="gpt-5-mini", instructions="be brief", input=[{"role": "user", "content": "city?"}],
            text={"format": {"type": "json_schema", "name": "result", "schema": SCHEMA, "strict": True}})
    assert json.loads(done.output_text) == {"city": "Oslo", "n": 3}
    assert done.usage is not None and done.usage.input_tokens > 0
    assert server.requests[0].messages[0] == {"role": "system", "content": "be brief"}


# -- Anthropic Messages -----------------------------------------------------------------------------------------------
async def test_messages_stream_with_thinking_text_tool_use_and_cache_usage_parses_with_the_anthropic_sdk() -> None:
    reply = Text("Checking.", reasoning="Oslo, then.", tool_calls=(Call("toolu_1", "weather", ARGS),),
                 cached_tokens=6, cache_write_tokens=2)
    async with serve(reply) as (server, _, an), an.messages.stream(
            model="claude-3-5-haiku-latest", max_tokens=200, system="be brief",
            messages=[{"role": "user", "content": "weather in Oslo?"}],
            tools=[{"name": "weather", "input_schema": WEATHER}]) as stream:
        partial = [e.partial_json async for e in stream if e.type == "input_json"]
        final = await stream.get_final_message()
    kinds = [block.type for block in final.content]
    assert kinds == ["thinking", "text", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[1].type == "text" and final.content[1].text == "Checking."
    tool = final.content[2]
    assert tool.type == "tool_use" and tool.name == "weather" and tool.input == json.loads(ARGS)
    assert len(partial) > 3
    u = final.usage
    assert u.cache_read_input_tokens == 6 and u.cache_creation_input_tokens == 2
    served = server.served[0]
    assert u.input_tokens + 6 + 2 == served.prompt_tokens and u.output_tokens == served.completion_tokens
    assert server.requests[0].messages[0] == {"role": "system", "content": "be brief"}


async def test_messages_tool_forcing_structured_output_parses_with_the_anthropic_sdk() -> None:
    async with serve(Text(json.dumps({"city": "Oslo", "n": 3}))) as (_, _oa, an):
        done = await an.messages.create(
            model="claude-3-5-haiku-latest", max_tokens=200, messages=[{"role": "user", "content": "city?"}],
            tools=[{"name": "result", "input_schema": SCHEMA}], tool_choice={"type": "tool", "name": "result"})
    assert done.content[0].type == "tool_use" and done.content[0].input == {"city": "Oslo", "n": 3}
    assert done.usage.output_tokens > 0


# -- errors: 429 with Retry-After, a cut stream -----------------------------------------------------------------------
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_each_sdk_waits_retry_after_on_a_429_then_succeeds(dialect: str) -> None:
    server = ScriptedLLM([HttpError(429, "slow down", retry_after=0.3), Text("ok")])
    async with server as base_url:
        started = time.monotonic()
        if dialect == "anthropic":
            async with anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="k",
                                                max_retries=1) as an:
                msg = await an.messages.create(model="claude-3-5-haiku-latest", max_tokens=10,
                                               messages=[{"role": "user", "content": "hi"}])
                text = msg.content[0].text if msg.content[0].type == "text" else ""
        else:
            async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=1) as oa:
                if dialect == "chat":
                    done = await oa.chat.completions.create(model="gpt-4o-mini",
                                                            messages=[{"role": "user", "content": "hi"}])
                    text = done.choices[0].message.content or ""
                else:
                    text = (await oa.responses.create(model="gpt-5-mini", input="hi")).output_text
        waited = time.monotonic() - started
    assert text == "ok" and [c.status for c in server.served] == [429, 200]
    assert waited >= 0.3  # the SDK honoured Retry-After


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_each_sdk_sees_a_cut_stream_as_an_error_not_a_short_reply(dialect: str) -> None:
    async with serve(Drop("half a sentence and then")) as (server, oa, an):
        got: list[str] = []
        with pytest.raises((httpx.HTTPError, openai.APIError, anthropic.APIError)):
            if dialect == "anthropic":
                async with an.messages.stream(model="claude-3-5-haiku-latest", max_tokens=50,
                                              messages=[{"role": "user", "content": "hi"}]) as stream:
                    async for text in stream.text_stream:
                        got.append(text)
            elif dialect == "responses":
                async with oa.responses.stream(model="gpt-5-mini", input="hi") as rstream:
                    async for event in rstream:
                        if event.type == "response.output_text.delta":
                            got.append(event.delta)
                    await rstream.get_final_response()
            else:
                chat = await oa.chat.completions.create(model="gpt-4o-mini", stream=True,
                                                        messages=[{"role": "user", "content": "hi"}])
                async for chunk in chat:
                    got += [c.delta.content or "" for c in chunk.choices]
    assert "".join(got) == "half a sentence and then"  # what was sent arrived, then the cut was an error
    assert server.served[0].completion_tokens > 0  # and the server billed it


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_each_sdk_sees_an_error_event_mid_stream_after_the_text(dialect: str) -> None:
    async with serve(StreamError("some text then", 500, "boom")) as (_, oa, an):
        got: list[str] = []
        seen: list[str] = []
        with pytest.raises((openai.APIError, anthropic.APIError, RuntimeError)):
            if dialect == "anthropic":
                async with an.messages.stream(model="claude-3-5-haiku-latest", max_tokens=50,
                                              messages=[{"role": "user", "content": "hi"}]) as stream:
                    async for text in stream.text_stream:
                        got.append(text)
            elif dialect == "responses":
                async with oa.responses.stream(model="gpt-5-mini", input="hi") as rstream:
                    async for event in rstream:
                        seen.append(event.type)
                        if event.type == "response.output_text.delta":
                            got.append(event.delta)
                    await rstream.get_final_response()  # no response.completed: RuntimeError
            else:
                chat = await oa.chat.completions.create(model="gpt-4o-mini", stream=True,
                                                        messages=[{"role": "user", "content": "hi"}])
                async for chunk in chat:
                    got += [c.delta.content or "" for c in chunk.choices]
    assert "".join(got) == "some text then"
    if dialect == "responses":
        assert seen[-2:] == ["error", "response.failed"]


async def test_a_script_lines_tool_call_and_reasoning_reach_the_anthropic_sdk() -> None:
    line = {"text": "Checking.", "reasoning": "Oslo.", "tool_calls": [{"id": "toolu_9", "name": "weather",
                                                                        "arguments": {"city": "Oslo"}}]}
    async with serve(reply_from_json(line)) as (_, _oa, an):
        done = await an.messages.create(model="claude-3-5-haiku-latest", max_tokens=50,
                                        messages=[{"role": "user", "content": "weather?"}])
    assert [b.type for b in done.content] == ["thinking", "text", "tool_use"]
    assert done.content[2].type == "tool_use" and done.content[2].input == {"city": "Oslo"}
