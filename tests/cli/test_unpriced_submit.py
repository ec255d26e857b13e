"""``planweave submit --budget-usd`` over a model without a price exits 2 before anything is queued (issue 27): the
check runs before the queue's journal is opened, so an unreachable one shows it came first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.test_goal_and_mcp import planweave

UNREACHABLE = "postgresql://planweave@127.0.0.1:9/none"  # nothing listens: reaching it would fail otherwise
ENV = {"PLANWEAVE_PRICES": ""}
LLM_PLAN = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "hi", "max_tokens": 20}}]}


def _plan(tmp_path: Path, plan: Any) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return str(path)


async def test_submit_with_a_dollar_budget_on_an_unpriced_model_exits_2_before_the_queue(tmp_path: Path) -> None:
    code, _, err = await planweave("submit", _plan(tmp_path, LLM_PLAN), "--journal", UNREACHABLE, "--model",
                                   "my-llama-70b", "--budget-usd", "0.5", cwd=tmp_path, env=ENV)
    assert code == 2, err
    assert "'my-llama-70b'" in err and "--budget-usd" in err and "prices = FILE in a --config" in err


async def test_submit_with_the_model_priced_or_a_token_budget_goes_on_to_the_queue(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("my-llama-70b: {input: 1, output: 2}\n", encoding="utf-8")
    plan = _plan(tmp_path, LLM_PLAN)
    for flags in (["--budget-usd", "0.5", "--config", f"prices={prices}"], ["--budget-tokens", "1000"]):
        code, _, err = await planweave("submit", plan, "--journal", UNREACHABLE, "--model", "my-llama-70b", *flags,
                                       cwd=tmp_path, env=ENV)
        assert code != 0 and "no known price" not in err  # past the check: the unreachable queue fails it
        assert "127.0.0.1:9" in err, err
