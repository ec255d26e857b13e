"""Prices come from the genai-prices database, with a price file over it; a model none of them knows has no price
(its cost unknown, a dollar budget refusing it), never a price of zero (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from genai_prices import Usage, calc_price

from planweave.core.plan.model import PlanSpec
from planweave.models.pricing import (
    Price,
    PriceTable,
    UnpricedModels,
    calls_llm,
    process_prices,
    read_price_file,
    require_prices,
    unpriced_calls,
    use_prices,
)


@pytest.fixture(autouse=True)
def no_process_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without a process price file (none set, $PLANWEAVE_PRICES unset) and leaves none behind."""
    monkeypatch.delenv("PLANWEAVE_PRICES", raising=False)
    monkeypatch.setattr("planweave.models.pricing._PROCESS_PRICES", [])  # not read yet; restored after the test


@pytest.mark.parametrize(("model", "provider"), [
    ("gpt-4o-mini", "openai"),
    ("gpt-4o-mini-2024-07-18", "openai"),  # the dated name OpenAI answers with
    ("claude-3-5-haiku-latest", "anthropic"),
    ("claude-sonnet-4-5", "anthropic"),
    ("gemini-2.5-flash", "google"),
    ("anthropic/claude-sonnet-4", "anthropic"),  # a provider/ prefix names the provider
])
def test_well_known_models_are_priced_from_the_database(model: str, provider: str) -> None:
    table = PriceTable()
    price = table.lookup(model)
    assert price is not None and price.input > 0 and price.output > price.input
    assert table.source(model) == f"genai-prices:{provider}"
    cost = table.cost(model, 1000, 500)
    ref = model.partition("/")[2] if "/" in model else model
    expected = calc_price(Usage(input_tokens=1000, output_tokens=500), ref,
                          provider_id=provider if "/" in model else None).total_price
    assert cost is not None and cost == pytest.approx(float(expected)) and cost > 0


def test_gpt_4o_mini_costs_its_list_price() -> None:
    assert PriceTable().lookup("gpt-4o-mini") == Price(0.15, 0.60, 0.075)
    assert PriceTable().cost("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.75)


def test_cached_prompt_tokens_cost_the_cached_rate() -> None:
    table = PriceTable()
    full = table.cost("gpt-4o-mini", 1_000_000, 0)
    half_cached = table.cost("gpt-4o-mini", 1_000_000, 0, cached_tokens=500_000)
    assert full == pytest.approx(0.15) and half_cached == pytest.approx(0.075 + 0.0375)
    assert Price(1.0, 2.0, cached_input=0.1).cost(1_000_000, 0, cached_tokens=1_000_000) == pytest.approx(0.1)
    assert Price(1.0, 2.0).cost(1_000_000, 0, cached_tokens=1_000_000) == pytest.approx(1.0)  # no cached rate


def test_prices_tiered_by_prompt_length_are_computed_by_the_database() -> None:
    table = PriceTable()
    short, long = table.cost("claude-sonnet-4-5", 100_000, 0), table.cost("claude-sonnet-4-5", 300_000, 0)
    assert short == pytest.approx(0.3) and long == pytest.approx(1.8)  # past 200k tokens every token costs $6/M
    assert table.lookup("claude-sonnet-4-5") == Price(3.0, 15.0, 0.3, 3.75)  # the base rates (cache read, write)


@pytest.mark.parametrize("model", ["my-llama-70b", "meta-llama/Llama-3.3-70B-Instruct", "local-llama", "scripted"])
def test_a_model_nobody_prices_has_no_price_not_zero(model: str) -> None:
    table = PriceTable()
    assert table.lookup(model) is None and table.cost(model, 100, 100) is None
    assert model not in table and table.source(model) is None


def test_the_bundled_local_model_and_offline_scripts_are_free() -> None:
    table = PriceTable()
    assert table.cost("local", 100, 100) == 0.0 and table.source("local") == "free"
    assert table.cost("scripted:examples/offline/repair.yaml", 100, 100) == 0.0


def test_a_price_file_prices_private_models_and_wins_over_the_database(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("my-llama-70b: {input: 0.5, output: 1.5}\ngpt-4o-mini: {input: 9, output: 9, cached_input: 1}\n",
                    encoding="utf-8")
    use_prices(path)
    table = PriceTable()
    assert table.lookup("my-llama-70b") == Price(0.5, 1.5) and table.source("my-llama-70b") == "table"
    assert table.cost("my-llama-70b", 1_000_000, 1_000_000) == pytest.approx(2.0)
    assert table.lookup("my-llama-70b-q4") == Price(0.5, 1.5)  # the longest entry its name starts with
    assert table.lookup("gpt-4o-mini") == Price(9.0, 9.0, 1.0)  # the file's price, not the database's
    assert table.lookup("claude-3-5-haiku-latest") is not None  # the database under the file
    require_prices(["my-llama-70b", "gpt-4o-mini"], 0.5)


def test_the_environment_variable_names_the_process_price_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"my-llama-70b": {"input": 1, "output": 2}}), encoding="utf-8")
    monkeypatch.setenv("PLANWEAVE_PRICES", str(path))
    assert process_prices() == {"my-llama-70b": Price(1.0, 2.0)}
    assert PriceTable().cost("my-llama-70b", 1_000_000, 0) == pytest.approx(1.0)


@pytest.mark.parametrize(("text", "says"), [
    ("my-llama-70b: {input: cheap, output: 1}\n", "price of model 'my-llama-70b' must be"),
    ("my-llama-70b: {input: -1, output: 1}\n", "must not be negative"),
    ("my-llama-70b: {input: 1, output: 1, currency: EUR}\n", "price of model 'my-llama-70b' must be"),
    ("my-llama-70b: {input: .nan, output: 1}\n", "price of model 'my-llama-70b' must be"),
    ("- my-llama-70b\n", "must map model names to prices"),
    ("a: [\n", "is not valid"),
])
def test_a_bad_price_file_is_refused_naming_it_and_the_model(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="price file") as info:
        read_price_file(path)
    assert str(path) in str(info.value) and says in str(info.value)


def test_an_explicit_table_holds_exactly_its_prices() -> None:
    table = PriceTable({"m": Price(1.0, 2.0)})
    assert table.lookup("m") == Price(1.0, 2.0)
    assert table.lookup("gpt-4o-mini") is None and table.lookup("local") is None
    assert PriceTable({}, builtin=True).lookup("gpt-4o-mini") is not None
    assert table.merged({"n": Price(3.0, 4.0)}).lookup("n") == Price(3.0, 4.0)


def test_a_dollar_budget_refuses_unpriced_models_naming_each_and_how_to_price_them() -> None:
    with pytest.raises(UnpricedModels) as info:
        require_prices(["gpt-4o-mini", "my-llama-70b", "my-llama-405b", "my-llama-70b"], 0.5)
    assert info.value.models == ("my-llama-70b", "my-llama-405b")
    message = str(info.value)
    assert "'my-llama-70b', 'my-llama-405b'" in message and "--budget-usd" in message
    assert "prices = FILE in a --config" in message and "$PLANWEAVE_PRICES" in message and "token budget" in message
    require_prices(["my-llama-70b"], None)  # a token budget, or none, needs no price
    with pytest.raises(UnpricedModels):
        require_prices(["my-llama-70b"], 0.0)  # a zero budget is a budget


def test_the_calls_of_unpriced_models_make_a_cost_unknown() -> None:
    calls = [
        {"model": "my-llama-70b", "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0},
        {"model": "gpt-4o-mini", "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0},
        {"model": "other", "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0},  # used no tokens
        {"model": "priced-then", "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.01},  # a price file's
        {"model": "local", "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0},
    ]
    assert unpriced_calls(calls) == ["my-llama-70b"]
    assert unpriced_calls(calls[1:]) == []


def test_a_plan_calls_a_model_through_its_llm_steps_and_fallbacks() -> None:
    def plan(*steps: dict[str, object]) -> PlanSpec:
        return PlanSpec.model_validate({"steps": list(steps)})

    assert calls_llm(plan({"id": "a", "tool": "llm", "args": {"prompt": "x"}}).steps)
    assert calls_llm(plan({"id": "a", "tool": "noop", "fallback": {"tool": "llm", "args": {"prompt": "x"}}}).steps)
    assert not calls_llm(plan({"id": "a", "tool": "noop"}).steps)


def test_a_dialect_prefix_is_priced_under_the_name_sent_and_cache_writes_at_their_rate_or_unknown() -> None:
    table = PriceTable()
    assert table.source("anthropic:claude-haiku-4-5") == "genai-prices:anthropic"
    assert table.lookup("openai-responses:gpt-4o-mini") == table.lookup("gpt-4o-mini")
    written = table.cost("anthropic:claude-haiku-4-5", 1_000_000, 0, 0, cache_write_tokens=1_000_000)
    assert written == pytest.approx(1.25)  # Anthropic's cache write rate, not the input rate
    own = PriceTable({"claude-x": Price(1.0, 5.0, cached_input=0.1)})
    assert own.cost("anthropic:claude-x", 1_000_000, 0, 500_000) == pytest.approx(0.55)
    assert own.cost("anthropic:claude-x", 1_000, 0, cache_write_tokens=10) is None  # no write rate: unknown
    priced = PriceTable({"claude-x": Price(1.0, 5.0, 0.1, cache_write_input=1.25)})
    assert priced.cost("claude-x", 1_000_000, 0, 0, cache_write_tokens=1_000_000) == pytest.approx(1.25)
    assert PriceTable.from_mapping({"m": {"input": 1, "output": 2, "cache_write_input": 1.25}}).lookup("m") == Price(
        1.0, 2.0, None, 1.25)
