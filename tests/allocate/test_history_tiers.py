"""The allocator decides on tier profiles fitted from the journal's history (the declared table as the prior):
runs through ``planweave run --tiers`` in a real process against the scripted server, where the small model's
answers fail their schema; the fit itself, pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planweave.allocate import TierProfile, TierTable
from planweave.allocate.history import PRIOR_WEIGHT, fitted_profile, fitted_table
from planweave.forecast.estimates import Observation, build_estimates
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from tests.allocate.conftest import Planweave

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
# Declared: both tiers as reliable, small cheaper; with no deadline, a fresh journal gives the step small.
TIERS = {
    "small": {"model": "m-small", "p_success": 0.99, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
PLAN = {"steps": [{"id": "a", "tool": "llm", "retries": 2, "args": {
    "prompt": "a?", "model": "auto", "tiers": ["small", "large"], "schema": SCHEMA, "max_tokens": 20}}]}


def by_quality(request: RecordedRequest) -> Reply:
    """m-large answers well; m-small answers with JSON that does not match the schema."""
    if request.body["model"] == "m-large":
        return Text('{"answer": "ok"}', prompt_tokens=20, completion_tokens=5)
    return Text('{"wrong": 1}', prompt_tokens=20, completion_tokens=5)


async def test_a_tier_that_failed_in_the_journals_runs_is_not_chosen_again(tmp_path: Path,
                                                                          planweave: Planweave) -> None:
    plan, tiers = tmp_path / "plan.yaml", tmp_path / "tiers.yaml"
    plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    models: list[str] = []

    def script(request: RecordedRequest) -> Reply:
        models.append(request.body["model"])
        return by_quality(request)

    async with ScriptedLLM(script) as base_url:
        async def run() -> tuple[int, str]:
            code, out, err = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url,
                                             "--config", f"tiers={tiers}", "--journal", journal, "--json", cwd=tmp_path)
            return code, json.loads(out)["run_id"] if out.strip() else err

        # A fresh journal: small, on every attempt (its three answers fail the schema: the run fails)
        first_code, first = await run()
        first_models = list(models)
        models.clear()
        # The same journal: small's three failed calls outweigh its declared 99% (prior weight 2): large
        second_code, second = await run()
        second_models = list(models)

    assert first_code == 1 and first_models == ["m-small"] * 3
    assert second_code == 0 and second_models == ["m-large"]
    code, out, err = await planweave("show", second, "--journal", journal, "--json", cwd=tmp_path)
    assert code == 0, err
    (decision,) = json.loads(out)["allocations"]
    # the allocation event says what history it decided on: small's 3 failed calls against its prior of 2
    assert decision["tier"] == "large"
    assert decision["history"] == {"small": {"calls": 3, "p_success": pytest.approx(2 * 0.99 / 5, abs=1e-4),
                                             "duration_s": pytest.approx(decision["history"]["small"]["duration_s"])}}
    assert decision["history"]["small"]["duration_s"] < 10.0  # the server answers in milliseconds
    compared = {c["tier"]: c["p_all"] for c in decision["compared"]}
    assert compared["large"] > compared["small"]
    code, out, err = await planweave("show", first, "--journal", journal, "--json", cwd=tmp_path)
    first_run = json.loads(out)["allocations"]
    assert [a["tier"] for a in first_run] == ["small"] * 3 and "history" not in first_run[0]


def test_a_declared_tier_is_the_prior_and_history_outweighs_it_as_it_grows() -> None:
    tier = TierProfile("small", "m-small", p_success=0.9, duration_s=10.0, cost_usd=0.001, tokens=100)
    table = TierTable({"small": tier, "large": TierProfile("large", "m-large", 0.99, 15.0, 0.01)})

    def history(n: int) -> TierTable:
        obs = [Observation("model", "m-small", 2.0, i % 4 == 0, 20, 5, 0.0002) for i in range(n)]
        return fitted_table(table, build_estimates(obs)).table

    assert fitted_table(table, build_estimates([])).table == table  # no history: as declared
    few, many = history(4)["small"], history(400)["small"]
    ok = sum(1 for i in range(4) if i % 4 == 0)
    assert few.p_success == pytest.approx((PRIOR_WEIGHT * 0.9 + ok) / (PRIOR_WEIGHT + 4))
    assert many.p_success == pytest.approx((PRIOR_WEIGHT * 0.9 + 100) / (PRIOR_WEIGHT + 400))
    assert abs(many.p_success - 0.25) < abs(few.p_success - 0.25)
    assert 2.0 < many.duration_s < few.duration_s < 10.0
    assert many.cost_usd == pytest.approx(PRIOR_WEIGHT / 402 * 0.001 + 400 / 402 * 0.0002)
    assert many.tokens == round(PRIOR_WEIGHT / 402 * 100 + 400 / 402 * 25)
    assert history(400)["large"] == table["large"]  # m-large has no history
    assert fitted_profile(tier, None) == tier


async def test_the_servers_allocator_reads_the_history_of_its_engines_journal() -> None:
    from planweave import Toolbox, open_engine
    from planweave.models.openai import Backoff, OpenAIChatClient
    from planweave.server.limits import ServerModel
    from planweave.tools.llm import llm_tool

    table = TierTable.from_mapping(TIERS)
    step = {"id": "a", "tool": "llm", "retries": 2, "args": {"prompt": "a?", "schema": SCHEMA, "max_tokens": 20}}
    async with ScriptedLLM(by_quality) as base_url:
        client = OpenAIChatClient("m-small", base_url=base_url, api_key="k",
                                  backoff=Backoff(attempts=1, base=0.01, cap=0.02))
        async with client, open_engine("memory://", tools=Toolbox({"llm": llm_tool(client)})) as engine:
            result = await (await engine.start({"steps": [step]})).wait()  # m-small's 3 answers fail the schema
            seam = ServerModel(engine, client, Toolbox()).allocation(table, None)
            assert seam is not None and seam.history is not None
            fitted = fitted_table(table, await seam.history())
    assert result.status == "failed"
    # each attempt is a call and its repair round trip (docs/tools.md): six failed calls
    assert fitted.calls == {"small": 6, "large": 0}
    assert fitted.table["small"].p_success == pytest.approx(2 * 0.99 / 8)
