"""A completion's cost charges the prompt tokens the provider read from its cache at the cached rate: the OpenAI
client reads ``usage.prompt_tokens_details.cached_tokens`` and the price table (a file's ``cached_input``, the
genai-prices database's cache read price) prices them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from planweave.models import CompletionRequest
from planweave.models.openai import OpenAIChatClient
from planweave.models.pricing import Price, PriceTable


def _endpoint(usage: dict[str, Any]) -> httpx.AsyncClient:
    """An OpenAI-compatible endpoint answering every chat completion with ``ok`` and ``usage``."""
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={
            "id": "c1", "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(("prices", "expected"), [
    (PriceTable({"gpt-4o-mini": Price(1.0, 2.0, cached_input=0.25)}), (200_000 * 1.0 + 800_000 * 0.25) / 1e6),
    (PriceTable(), (200_000 * 0.15 + 800_000 * 0.075 + 0 * 0.6) / 1e6),  # the database's gpt-4o-mini
])
async def test_cached_prompt_tokens_are_billed_at_the_cached_rate(prices: PriceTable, expected: float) -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 0, "total_tokens": 1_000_000,
             "prompt_tokens_details": {"cached_tokens": 800_000}}
    async with _endpoint(usage) as http, OpenAIChatClient("gpt-4o-mini", base_url="http://provider.test/v1",
                                                         api_key="k", prices=prices, http=http) as client:
        completion = await client.complete(CompletionRequest.of("hi"))
    assert completion.cost_usd == pytest.approx(expected)


async def test_without_cache_details_every_prompt_token_is_input() -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000, "total_tokens": 2_000_000}
    prices = PriceTable({"gpt-4o-mini": Price(1.0, 2.0, cached_input=0.25)})
    async with _endpoint(usage) as http, OpenAIChatClient("gpt-4o-mini", base_url="http://provider.test/v1",
                                                         api_key="k", prices=prices, http=http) as client:
        completion = await client.complete(CompletionRequest.of("hi"))
    assert completion.cost_usd == pytest.approx(3.0)
