"""Every token of a stream is counted, also when it is cut: Delta usage, StreamMeter, and the ``llm`` tool.

The scripted server bills a stream as it goes (its prompt when it starts, each token as it is written), so the
tests compare what planweave charged and journaled with what the server really sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import pytest

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.core.errors import ToolError
from planweave.engine.runtime import RunResult
from planweave.models import Budget, CompletionRequest, Delta, StreamMeter, Usage
from planweave.models.openai import Backoff, OpenAIChatClient, reset_server_compat
from planweave.testing import Drop, ScriptedLLM, Stall, Text
from planweave.tools.llm import llm_tool
from tests.timing import on_virtual_clock

WORDS = "one two three four five six seven eight nine ten " * 3  # 30 tokens as the server counts them


@pytest.fixture(autouse=True)
def _fresh_compat() -> Iterator[None]:
    reset_server_compat()
    yield
    reset_server_compat()


@asynccontextmanager
async def served(script: Any, **server: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    scripted = ScriptedLLM(script, **server)
    async with scripted as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k",
                                                      backoff=Backoff(attempts=1, base=0.01, cap=0.02)) as client:
        yield scripted, client


# -- StreamMeter ---------------------------------------------------------------------------------------------------
def test_a_meter_without_usage_in_its_deltas_estimates_four_characters_a_token() -> None:
    meter = StreamMeter(prompt_tokens=20)
    assert not meter.received
    meter.feed(Delta("abcdefghi"))  # 9 characters: 3 tokens, rounded up (never understated)
    assert meter.received
    assert meter.spent() == Usage(20, 3, "estimated")


def test_a_meter_takes_the_servers_counts_and_estimates_only_the_text_after_them() -> None:
    meter = StreamMeter(prompt_tokens=20)
    meter.feed(Delta("ab", Usage(31, 2, "server")))
    assert meter.spent() == Usage(31, 2, "server")
    meter.feed(Delta("cdefg"))  # no counts for these 5 characters: 2 more tokens, estimated
    assert meter.spent() == Usage(31, 4, "estimated")


# -- the OpenAI client's deltas ------------------------------------------------------------------------------------
@pytest.mark.parametrize("every", [False, True])
@on_virtual_clock
async def test_every_delta_carries_the_calls_usage_so_far(every: bool) -> None:
    async with served([Text(WORDS)], tokens_per_second=10, usage_in_every_chunk=every) as (server, client):
        seen: list[Usage] = []
        async with aclosing(client.stream(CompletionRequest.of("count"))) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, Delta):
                    assert chunk.usage is not None
                    seen.append(chunk.usage)
                else:
                    completion = chunk
    call = server.served[0]
    assert len(seen) > 1  # paced: several network reads
    assert seen[-1].total_tokens == call.tokens == completion.total_tokens
    assert {u.source for u in seen} == ({"server"} if every else {"estimated"})
    assert [u.completion_tokens for u in seen] == sorted(u.completion_tokens for u in seen)


# -- the llm tool ----------------------------------------------------------------------------------------------------
async def test_a_dropped_stream_is_charged_at_least_what_the_server_sent() -> None:
    budget = Budget(tokens=10_000)
    async with served([Drop(after=WORDS)]) as (server, client):
        with pytest.raises(ToolError) as info:
            await llm_tool(client, budget).invoke({"prompt": "go", "max_tokens": 100})
    assert info.value.kind == "unavailable"
    assert budget.reserved_tokens == 0 and budget.open_reservations == 0
    assert budget.spent_tokens >= server.served[0].tokens > 30


async def run_step(script: Any, **server_options: Any) -> tuple[RunResult, ScriptedLLM]:
    async with served(script, **server_options) as (server, client):
        box: Toolbox = builtin_tools()
        box = box.merged(Toolbox({"llm": llm_tool(client, Budget(tokens=10_000))}))
        async with open_engine("memory://", tools=box, clock=VirtualClock()) as engine:
            run = await engine.start({"steps": [
                {"id": "ask", "tool": "llm", "args": {"prompt": "count", "max_tokens": 100}, "timeout": 5}]})
            return await run.wait(), server


@pytest.mark.parametrize("every", [False, True])
@on_virtual_clock
async def test_an_llm_step_cancelled_mid_stream_journals_what_it_cost(every: bool) -> None:
    # The reply stalls after 30 tokens; the step's 5 s timeout cancels the call with the text received.
    result, server = await run_step([Stall(after=WORDS, seconds=None)], usage_in_every_chunk=every)
    assert result.state.records["ask"].status == "failed"
    (call,) = result.state.model_calls
    assert call["cut"] == "CancelledError"
    assert call["usage_source"] == ("server" if every else "estimated")
    tokens = int(call["prompt_tokens"]) + int(call["completion_tokens"])
    served_tokens = server.served[0].tokens
    assert tokens >= served_tokens > 30
    if every:
        assert tokens == served_tokens  # the server's own counts
    assert result.summary["tokens"] == tokens
