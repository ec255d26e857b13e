"""The ``llm`` tool: text and JSON results, budgets reserved before calls, model errors as ToolErrors."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from planweave import Toolbox, builtin_tools, open_engine
from planweave.core.errors import ToolError
from planweave.models import Budget
from planweave.models.openai import Backoff, OpenAIChatClient, Timeouts, reset_server_compat
from planweave.models.pricing import Price, PriceTable
from planweave.testing import Drop, HttpError, RecordedRequest, Reply, ScriptedLLM, Stall, Text
from planweave.tools.llm import llm_tool

PRICES = PriceTable({"gpt-4o-mini": Price(input=1.0, output=4.0)})
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}


@pytest.fixture(autouse=True)
def _fresh_compat() -> Iterator[None]:
    reset_server_compat()
    yield
    reset_server_compat()


@asynccontextmanager
async def served(script: Any, **client_options: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    client_options.setdefault("backoff", Backoff(attempts=2, base=0.01, cap=0.02))
    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("gpt-4o-mini", base_url=base_url, api_key="k", prices=PRICES,
                                                    **client_options) as client:
        yield server, client


async def test_returns_text_tokens_cost_and_model() -> None:
    async with served([Text("Paris is the capital.", prompt_tokens=100, completion_tokens=6)]) as (server, client):
        tool = llm_tool(client, prices=PRICES)
        result = await tool.invoke({"prompt": "Capital of France?", "system": "Be terse.", "max_tokens": 20,
                                    "temperature": 0})
    assert result == {
        "text": "Paris is the capital.",
        "tokens": {"prompt": 100, "completion": 6, "total": 106, "estimated": False},
        "cost_usd": pytest.approx((100 * 1.0 + 6 * 4.0) / 1e6),
        "model": "gpt-4o-mini",
    }
    body = server.requests[0].body
    assert body["messages"][0] == {"role": "system", "content": "Be terse."}
    assert body["max_tokens"] == 20 and body["temperature"] == 0
    assert tool.name == "llm" and tool.idempotent


async def test_a_schema_returns_parsed_json() -> None:
    async with served([Text('{"city": "Paris"}')]) as (server, client):
        result = await llm_tool(client).invoke({"prompt": "Where?", "schema": SCHEMA})
    assert result["json"] == {"city": "Paris"}
    assert "text" not in result
    assert server.requests[0].response_format["type"] == "json_schema"


async def test_the_model_comes_from_the_step_then_the_factory_then_the_client() -> None:
    async with served(lambda r: Text("ok")) as (server, client):
        await llm_tool(client).invoke({"prompt": "a"})
        await llm_tool(client, default_model="gpt-4.1-nano").invoke({"prompt": "b"})
        await llm_tool(client, default_model="gpt-4.1-nano").invoke({"prompt": "c", "model": "o3"})
    assert [r.body["model"] for r in server.chat_requests] == ["gpt-4o-mini", "gpt-4.1-nano", "o3"]


async def test_bad_arguments_fail_without_calling_the_model() -> None:
    async with served([]) as (server, client):
        tool = llm_tool(client)
        for args in ({"prompt": "x", "max_tokens": 0}, {"prompt": "x", "temperature": 3}, {"promt": "x"},
                     {"prompt": "x", "schema": {"type": "thing"}}):
            with pytest.raises(ToolError) as info:
                await tool.invoke(args)
            assert info.value.kind == "arguments" and not info.value.retryable
    assert server.requests == []


# -- budgets ---------------------------------------------------------------------------------------------------------
async def test_a_call_reserves_before_and_settles_the_actual_usage_after() -> None:
    budget = Budget(usd=1.0, tokens=10_000)
    seen: list[tuple[float, int]] = []

    def script(request: RecordedRequest) -> Reply:
        seen.append((budget.reserved_usd, budget.reserved_tokens))
        return Text("short", prompt_tokens=20, completion_tokens=2)

    async with served(script) as (_, client):
        await llm_tool(client, budget, prices=PRICES).invoke({"prompt": "x" * 40, "max_tokens": 500})
    reserved_usd, reserved_tokens = seen[0]
    assert reserved_tokens >= 500 + 10 and reserved_usd >= 500 * 4.0 / 1e6  # the worst case was held during the call
    assert budget.reserved_tokens == 0 and budget.open_reservations == 0
    assert budget.spent_tokens == 22
    assert budget.spent_usd == pytest.approx((20 * 1.0 + 2 * 4.0) / 1e6)


async def test_a_call_below_its_floor_fails_with_kind_budget_before_any_request() -> None:
    async with served([Text("never")]) as (server, client):
        tool = llm_tool(client, Budget(tokens=30), min_tokens=32)
        with pytest.raises(ToolError) as info:
            await tool.invoke({"prompt": "x", "max_tokens": 200})
    assert info.value.kind == "budget" and not info.value.retryable
    assert "tokens do not fit" in str(info.value) and "below the floor" in str(info.value)
    assert server.requests == []


async def test_a_call_that_does_not_fit_runs_with_max_tokens_lowered_to_what_remains() -> None:
    budget = Budget(tokens=100)
    async with served([Text("fits")]) as (server, client):
        result = await llm_tool(client, budget, min_tokens=32).invoke({"prompt": "x", "max_tokens": 200})
    assert result["text"] == "fits"
    sent = server.chat_requests[0].body
    # worst case: the prompt estimate with its margin (ceil(7 * 1.25) = 9) plus max_tokens; 100 - 9 remain
    assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 91
    assert budget.reserved_tokens == 0 and 0 < budget.spent_tokens <= 100


async def test_a_usd_budget_refuses_a_model_without_a_price_but_a_token_budget_does_not() -> None:
    async with served([Text("fine")]) as (server, client):
        with pytest.raises(ToolError, match="no price") as info:
            await llm_tool(client, Budget(usd=1.0)).invoke({"prompt": "x", "model": "mystery"})
        assert info.value.kind == "budget"
        assert server.requests == []
        result = await llm_tool(client, Budget(tokens=5000)).invoke({"prompt": "x", "model": "mystery"})
    assert result["text"] == "fine" and result["cost_usd"] is None


async def test_concurrent_calls_wait_for_room_and_never_overshoot_the_budget() -> None:
    budget = Budget(tokens=3 * 1100)  # room for three worst cases of ~1,000 tokens at once

    async def script(request: RecordedRequest) -> Reply:
        await asyncio.sleep(0.05)
        return Text("ok", prompt_tokens=10, completion_tokens=1)

    async with served(script) as (server, client):
        tool = llm_tool(client, budget, default_max_tokens=1000)
        results = await asyncio.gather(*(tool.invoke({"prompt": "go"}) for _ in range(8)), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []  # the five that did not fit waited
    assert len(server.chat_requests) == 8
    assert max(call.concurrency for call in server.served) == 3  # never more worst cases at once than fit
    assert budget.spent_tokens == 88 and budget.reserved_tokens == 0


async def test_a_stream_cut_mid_way_is_charged_an_estimate() -> None:
    budget = Budget(tokens=10_000)
    async with served([Drop(after="x" * 40)]) as (_, client):
        with pytest.raises(ToolError) as info:
            await llm_tool(client, budget).invoke({"prompt": "go", "max_tokens": 100})
    assert info.value.kind == "unavailable" and info.value.retryable
    assert budget.reserved_tokens == 0
    assert 10 <= budget.spent_tokens <= 100 + 10


async def test_a_cancelled_call_before_any_text_releases_its_reservation() -> None:
    budget = Budget(tokens=10_000)
    arrived = asyncio.Event()

    def script(request: RecordedRequest) -> Reply:
        arrived.set()
        return Stall()

    async with served(script) as (_, client):
        task = asyncio.create_task(llm_tool(client, budget).invoke({"prompt": "go"}))
        await arrived.wait()
        assert budget.reserved_tokens > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert budget.reserved_tokens == 0 and budget.spent_tokens == 0


# -- model errors as ToolErrors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "kind", "retryable"),
    [
        (HttpError(429, retry_after=600), "rate_limited", True),
        (HttpError(400, "bad"), "provider_error", False),
        (HttpError(503, "down"), "provider_error", True),
        (Stall(after="partial"), "timeout", True),
        (Text('{"town": "Paris"}'), "malformed_output", True),
    ],
)
async def test_model_errors_map_to_tool_error_kinds(reply: Reply, kind: str, retryable: bool) -> None:
    timeouts = Timeouts(connect=1, read=2, stall=0.2)
    async with served([reply] * 3, timeouts=timeouts) as (_, client):
        with pytest.raises(ToolError) as info:
            await llm_tool(client).invoke({"prompt": "x", "schema": SCHEMA})
    assert (info.value.kind, info.value.retryable) == (kind, retryable)
    assert "gpt-4o-mini" in str(info.value)


async def test_an_unreachable_server_is_kind_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAIChatClient("gpt-4o-mini", base_url=f"http://127.0.0.1:{port}/v1", backoff=Backoff(attempts=1))
    async with client:
        with pytest.raises(ToolError) as info:
            await llm_tool(client).invoke({"prompt": "x"})
    assert (info.value.kind, info.value.retryable) == ("unavailable", True)


# -- in a plan -------------------------------------------------------------------------------------------------------
async def test_a_plan_step_uses_the_llm_tool_with_references() -> None:
    def script(request: RecordedRequest) -> Reply:
        prompt = request.messages[-1]["content"]
        if "Extract" in prompt:
            return Text('{"city": "Lyon"}')
        return Text(f"echo: {prompt}")

    async with served(script) as (_, client):
        tools = Toolbox({"llm": llm_tool(client)}).merged(builtin_tools())
        plan = {"steps": [
            {"id": "extract", "tool": "llm", "args": {"prompt": "Extract the city.", "schema": SCHEMA}},
            {"id": "write", "tool": "llm", "args": {"prompt": "Describe ${extract.json.city}."}},
        ]}
        async with open_engine("memory://", tools=tools) as engine:
            result = await (await engine.start(plan)).wait()
    assert result.ok, result.error
    assert result.outputs["write"]["text"] == "echo: Describe Lyon."
