"""``llm`` steps with a ``schema``: asked of the endpoint in its dialect (Chat ``json_schema``, an Anthropic forced
tool), checked client-side either way, one repair round trip with the error fed back, then a failure naming the
schema path. Against the scripted server in Chat Completions and Anthropic Messages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from planweave import Tool, Toolbox, open_engine
from planweave.core.errors import ToolError
from planweave.models import client_class
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.models.pricing import Price, PriceTable
from planweave.testing import Call, RecordedRequest, Reply, ScriptedLLM, Text
from planweave.tools.llm import llm_tool

MODELS = {"openai": "openai:gpt-4o-mini", "anthropic": "anthropic:claude-3-5-haiku-latest"}
PRICES = PriceTable({"gpt-4o-mini": Price(input=1.0, output=4.0),
                     "claude-3-5-haiku-latest": Price(input=0.8, output=4.0)})
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "integer"}},
          "required": ["city", "temp"]}

pytestmark = pytest.mark.parametrize("dialect", list(MODELS))


@asynccontextmanager
async def scripted(dialect: str, replies: list[Reply]) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    name = MODELS[dialect]
    server = ScriptedLLM(replies)
    async with server as base_url, client_class(name)(name, base_url=base_url, api_key="k", prices=PRICES,
                                                       backoff=Backoff(attempts=2, base=0.01, cap=0.02)) as client:
        yield server, client


def asked_structure(dialect: str, req: RecordedRequest) -> bool:
    """Whether the request asked the endpoint for the schema in its dialect's own way."""
    if dialect == "anthropic":
        return req.body.get("tool_choice") == {"type": "tool", "name": "result"} and any(
            t["name"] == "result" and t["input_schema"] == SCHEMA for t in req.body["tools"])
    return bool(req.body["response_format"] == {"type": "json_schema",
                                                "json_schema": {"name": "result", "schema": SCHEMA}})


def last_user_text(dialect: str, req: RecordedRequest) -> str:
    content = req.body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


async def test_a_valid_reply_is_the_parsed_json_in_one_call(dialect: str) -> None:
    async with scripted(dialect, [Text('{"city": "Paris", "temp": 21}', prompt_tokens=30, completion_tokens=9)]
                        ) as (server, client):
        out = await llm_tool(client).invoke({"prompt": "Weather?", "schema": SCHEMA})
    assert out["json"] == {"city": "Paris", "temp": 21}
    assert out["tokens"]["total"] == 39
    assert len(server.model_requests) == 1 and asked_structure(dialect, server.model_requests[0])


async def test_an_invalid_reply_is_repaired_with_the_error_fed_back(dialect: str) -> None:
    replies: list[Reply] = [Text('{"city": "Paris", "temp": "warm"}', prompt_tokens=30, completion_tokens=9),
                            Text('{"city": "Paris", "temp": 21}', prompt_tokens=60, completion_tokens=9)]
    async with scripted(dialect, replies) as (server, client):
        out = await llm_tool(client).invoke({"prompt": "Weather?", "schema": SCHEMA})
    assert out["json"] == {"city": "Paris", "temp": 21}
    # both calls; the rejected one's usage is what its stream showed (Chat sends the counts in the last chunk, after
    # which the client refused the reply: its prompt is then estimated, and said to be)
    tokens = out["tokens"]
    assert tokens["completion"] == 18 and tokens["prompt"] > 60 and tokens["estimated"]
    if dialect == "anthropic":  # its message_start gave the prompt's count before the reply
        assert tokens["prompt"] == 90
    repair = server.model_requests[1]
    assert asked_structure(dialect, repair)
    note = last_user_text(dialect, repair)
    assert "at temp" in note and "'warm' is not of type 'integer'" in note
    previous = repair.body["messages"][-2]
    assert previous["role"] == "assistant" and "warm" in str(previous["content"])


async def test_an_invalid_reply_twice_fails_the_step_naming_the_schema_path(dialect: str) -> None:
    bad: list[Reply] = [Text('{"city": "Paris"}'), Text('{"city": 7, "temp": 3}')]
    async with scripted(dialect, bad) as (server, client):
        with pytest.raises(ToolError) as info:
            await llm_tool(client).invoke({"prompt": "Weather?", "schema": SCHEMA})
        plan = {"steps": [{"id": "w", "tool": "llm", "args": {"prompt": "Weather?", "schema": SCHEMA}}]}
        server.push(*bad)
        async with open_engine("memory://", tools=Toolbox({"llm": llm_tool(client)})) as engine:
            result = await (await engine.start(plan)).wait()
    assert info.value.kind == "malformed_output"
    assert "at city: 7 is not of type 'string'" in str(info.value)
    assert "after one repair round trip" in str(info.value)
    assert "'temp' is a required property" in str(info.value)  # the first miss, named too
    assert len(server.model_requests) == 4  # two calls each, no more
    assert not result.ok
    assert "at city" in (result.state.records["w"].error or "")


async def test_with_tools_the_final_answer_is_checked_and_repaired(dialect: str) -> None:
    """Tools and a schema: the rounds offer the tools; the answer is checked against the schema (asked of a Chat
    endpoint with the tools; checked here for Anthropic, whose structured output is a forced tool) and repaired."""
    def script(req: RecordedRequest) -> Reply:
        n = len(server.model_requests)
        if n == 1:
            return Text("", tool_calls=(Call("c1", "lookup", '{"city": "Paris"}'),))
        if n == 2:
            return Text('{"city": "Paris"}')  # no temp: repaired
        return Text('{"city": "Paris", "temp": 21}')

    async def lookup(city: str) -> dict[str, Any]:
        """Today's temperature in a city."""
        return {"temp": 21}

    name = MODELS[dialect]
    server = ScriptedLLM(script)
    async with server as base_url, client_class(name)(name, base_url=base_url, api_key="k", prices=PRICES) as client:
        tools = Toolbox({"llm": llm_tool(client), "lookup": Tool.from_function(lookup, name="lookup")})
        plan = {"steps": [{"id": "w", "tool": "llm", "args": {"prompt": "Weather?", "schema": SCHEMA,
                                                               "tools": ["lookup"]}}]}
        async with open_engine("memory://", tools=tools) as engine:
            result = await (await engine.start(plan)).wait()
    assert result.ok, result.error
    assert result.outputs["w"]["json"] == {"city": "Paris", "temp": 21}
    assert result.outputs["w"]["rounds"] == 1
    assert len(server.model_requests) == 3
    assert asked_structure(dialect, server.model_requests[2])
    assert "temp" in last_user_text(dialect, server.model_requests[2])
