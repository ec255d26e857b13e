"""A dollar budget on a model without a price is refused before any model call (issue 27): ``planweave run`` exits 2
naming the model and how to price it; a config's ``prices = FILE`` or ``$PLANWEAVE_PRICES`` price it and the run is
billed; a token budget needs no price, and the run's cost is then shown as unknown, never $0."""

from __future__ import annotations

import json
from pathlib import Path

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.test_goal_and_mcp import planweave

MODEL = "my-llama-70b"
KEY = {"OPENAI_API_KEY": "sk-test", "PLANWEAVE_PRICES": ""}  # no price file from the caller's environment


def _script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "done"}))
    return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 1}}]))


def _goal(base_url: str, tmp_path: Path, *flags: str) -> tuple[str, ...]:
    return ("goal", "do one thing", "--model", MODEL, "--base-url", base_url,
            "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json", *flags)


async def test_a_dollar_budget_on_an_unpriced_model_exits_2_before_any_model_call(tmp_path: Path) -> None:
    server = ScriptedLLM(_script, models=(MODEL,))
    async with server as base_url:
        code, out, err = await planweave(*_goal(base_url, tmp_path, "--budget-usd", "0.5"), cwd=tmp_path, env=KEY)
    assert code == 2, (out, err)
    assert server.requests == []  # refused before the planner's first request
    said = out + err
    assert f"'{MODEL}'" in said and "--budget-usd" in said
    assert "prices = FILE in a --config" in said and "PLANWEAVE_PRICES" in said
    assert not (tmp_path / "runs.db").exists()  # refused before the journal was opened: no run was started


async def test_a_prices_file_prices_the_model_and_the_run_is_billed(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{MODEL}: {{input: 1.0, output: 2.0}}\n", encoding="utf-8")
    server = ScriptedLLM(_script, models=(MODEL,))
    async with server as base_url:
        code, out, err = await planweave(*_goal(base_url, tmp_path, "--budget-usd", "0.5", "--config",
                                                f"prices={prices}"),
                                         cwd=tmp_path, env=KEY)
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "succeeded" and report["tokens"] > 0
    assert report["cost_usd"] is not None and 0 < report["cost_usd"] <= report["tokens"] * 2.0 / 1e6
    assert "unpriced_models" not in report
    assert len(server.requests) >= 1


async def test_the_prices_environment_variable_prices_the_model_too(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({MODEL: {"input": 1.0, "output": 2.0}}), encoding="utf-8")
    async with ScriptedLLM(_script, models=(MODEL,)) as base_url:
        code, out, err = await planweave(*_goal(base_url, tmp_path, "--budget-usd", "0.5"), cwd=tmp_path,
                                         env={**KEY, "PLANWEAVE_PRICES": str(prices)})
    assert code == 0, err
    assert json.loads(out)["cost_usd"] > 0


async def test_a_token_budget_runs_an_unpriced_model_and_its_cost_is_shown_unknown(tmp_path: Path) -> None:
    async with ScriptedLLM(_script, models=(MODEL,)) as base_url:
        code, out, err = await planweave(*_goal(base_url, tmp_path, "--budget-tokens", "100000"), cwd=tmp_path,
                                         env=KEY)
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"] > 0
    assert report["cost_usd"] is None and report["unpriced_models"] == [MODEL]  # unknown, not $0
    journal = ("--journal", f"sqlite:///{tmp_path / 'runs.db'}")
    code, out, err = await planweave("show", report["run_id"], *journal, "--json", cwd=tmp_path, env=KEY)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["cost_usd"] is None and shown["unpriced_models"] == [MODEL]
    code, out, err = await planweave("show", report["run_id"], *journal, cwd=tmp_path, env=KEY)
    assert code == 0, err
    assert f"cost unknown (no price for '{MODEL}')" in out and "$0.0000" not in out


async def test_a_tier_table_under_a_dollar_budget_needs_every_tier_priced(tmp_path: Path) -> None:
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(json.dumps({
        "small": {"model": "gpt-4o-mini", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
        "large": {"model": "my-llama-405b", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
    }), encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"steps": [{"id": "a", "tool": "llm", "args": {
        "prompt": "a?", "model": "auto", "tiers": ["small", "large"], "max_tokens": 20}}]}), encoding="utf-8")
    server = ScriptedLLM([Text("ok")], models=("gpt-4o-mini", "my-llama-405b"))
    async with server as base_url:
        code, out, err = await planweave("run", str(plan), "--model", "gpt-4o-mini", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--budget-usd", "1", "--journal", "memory://",
                                         cwd=tmp_path, env=KEY)
        assert code == 2, (out, err)
        assert "'my-llama-405b'" in err and "'gpt-4o-mini'" not in err and "prices = FILE in a --config" in err
        # A token budget bounds the same tiers without prices.
        code, out, err = await planweave("run", str(plan), "--model", "gpt-4o-mini", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--budget-tokens", "10000", "--journal",
                                         "memory://", cwd=tmp_path, env=KEY)
    assert code == 0, err
    assert server.requests == [server.requests[0]]  # only the run with a token budget called a model


async def test_a_bad_prices_file_exits_2_naming_it(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{MODEL}: {{input: cheap}}\n", encoding="utf-8")
    code, _, err = await planweave("goal", "x", "--model", MODEL, "--budget-usd", "1", "--config",
                                   f"prices={prices}", "--journal", "memory://", cwd=tmp_path, env=KEY)
    assert code == 2
    assert str(prices) in err and f"'{MODEL}'" in err
