"""With nothing in flight, a call that does not fit is lowered to what remains of a dollar budget too."""

from __future__ import annotations

import asyncio

import pytest

from planweave.models import Budget, BudgetExceeded
from planweave.models.openai import OpenAIChatClient
from planweave.models.pricing import Price, PriceTable
from planweave.testing import ScriptedLLM, Text
from planweave.tools.llm import llm_tool

PER_TOKEN = 4.0 / 1e6  # $4 per million reply tokens


def test_a_dollar_budget_lowers_the_reply_until_its_cost_fits() -> None:
    budget = Budget(usd=0.001)  # room for the prompt and 200 reply tokens at $4/M
    worst = 0.0002 + 1000 * PER_TOKEN  # a prompt costing $0.0002, and 1,000 reply tokens
    granted = asyncio.run(budget.acquire(worst, 1050, floor_tokens=50 + 64, usd_per_token=PER_TOKEN))
    assert granted.tokens == 50 + 200  # $0.0008 left after the prompt buys 200 reply tokens
    assert granted.usd <= 0.001 and budget.remaining_usd is not None and budget.remaining_usd >= 0


def test_a_dollar_budget_refuses_below_the_floor_and_without_a_price_per_token() -> None:
    worst = 0.0002 + 1000 * PER_TOKEN
    with pytest.raises(BudgetExceeded, match="below the floor of 314"):
        asyncio.run(Budget(usd=0.001).acquire(worst, 1050, floor_tokens=50 + 264, usd_per_token=PER_TOKEN))
    with pytest.raises(BudgetExceeded) as info:  # no price: the dollars cannot be traded for fewer tokens
        asyncio.run(Budget(usd=0.001).acquire(worst, 1050, floor_tokens=50 + 64))
    assert "below the floor" not in str(info.value)


def test_an_llm_step_under_a_dollar_budget_runs_with_max_tokens_lowered_and_spends_within_it() -> None:
    prices = PriceTable({"priced": Price(input=1.0, output=4.0)})
    budget = Budget(usd=0.0005)

    async def go() -> tuple[ScriptedLLM, dict[str, object]]:
        server = ScriptedLLM([Text("fits", completion_tokens=1)])
        async with server as base_url, OpenAIChatClient("priced", base_url=base_url, api_key="k",
                                                        prices=prices) as client:
            result = await llm_tool(client, budget, prices=prices).invoke({"prompt": "x" * 40, "max_tokens": 1000})
        return server, result

    server, result = asyncio.run(go())
    assert result["text"] == "fits"
    sent = server.chat_requests[0].body
    max_tokens = sent.get("max_tokens", sent.get("max_completion_tokens"))
    assert 64 <= max_tokens < 1000  # lowered: 1,000 reply tokens would cost $0.004
    assert max_tokens * 4.0 / 1e6 <= 0.0005
    assert budget.spent_usd <= 0.0005 and budget.reserved_usd == 0
