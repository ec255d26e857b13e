"""planweave run plan.yaml --model M --tiers FILE [--cascade]: cascaded steps from the command line, in a real
process against the scripted server; show lists the escalation; --cascade without --tiers exits 2 naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planweave.cli.main import app
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from tests.allocate.conftest import planner_script
from tests.allocate.conftest import run_planweave as planweave

TIERS = {
    "small": {"model": "m-small", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def write(tmp_path: Path, model: str) -> tuple[Path, Path]:
    plan, tiers = tmp_path / "plan.yaml", tmp_path / "tiers.yaml"
    step: dict[str, Any] = {"id": "a", "tool": "llm", "retries": 2, "args": {
        "prompt": "a?", "model": model, "tiers": ["large", "small"], "schema": SCHEMA, "max_tokens": 20}}
    plan.write_text(yaml.safe_dump({"steps": [step]}), encoding="utf-8")
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    return plan, tiers


@pytest.mark.parametrize(("model", "flags"), [("cascade", []), ("auto", ["--config", "cascade=true"])])
async def test_run_with_tiers_cascades_from_the_small_model_up(tmp_path: Path, model: str, flags: list[str]) -> None:
    plan, tiers = write(tmp_path, model)
    models: list[str] = []

    def script(request: RecordedRequest) -> Reply:
        models.append(request.body["model"])
        return Text('{"answer": "yes"}' if request.body["model"] == "m-large" else '{"nope": 1}')

    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(script) as base_url:
        code, out, err = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", *flags, "--journal", journal, "--json",
                                         cwd=tmp_path)
    assert code == 0, err
    assert models == ["m-small", "m-large"]  # cheapest first although the step lists large first
    run_id = json.loads(out)["run_id"]
    code, out, err = await planweave("show", run_id, "--journal", journal, cwd=tmp_path)
    assert code == 0, err
    assert "escalate step 'a' (milestone): small -> large" in out


async def test_cascade_false_keeps_a_step_allocated_under_the_cascade_flag(tmp_path: Path) -> None:
    plan, tiers = write(tmp_path, "auto")
    document = yaml.safe_load(plan.read_text(encoding="utf-8"))
    document["steps"][0]["args"]["cascade"] = False
    plan.write_text(yaml.safe_dump(document), encoding="utf-8")
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(lambda r: Text('{"answer": "yes"}')) as base_url:
        code, out, err = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--config", "cascade=true", "--journal", journal,
                                         "--json", cwd=tmp_path)
        assert code == 0, err
        code, shown, err = await planweave("show", json.loads(out)["run_id"], "--journal", journal, "--json",
                                           cwd=tmp_path)
    assert code == 0, err
    assert [a["step"] for a in json.loads(shown)["allocations"]] == ["a"]  # decided by the allocator


def test_cascade_without_tiers_exits_2_naming_it(tmp_path: Path) -> None:
    plan, _ = write(tmp_path, "cascade")
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["run", str(plan), "--model", "m", "--config", "cascade=true", "--journal",
              f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.exit_code == 2, result.output
    assert "key 'cascade' needs the tiers to cascade over: give tiers = FILE too" in " ".join(result.output.split())


async def test_a_goal_run_with_tiers_and_cascade_escalates_its_planner(tmp_path: Path) -> None:
    _, tiers = write(tmp_path, "cascade")
    seen: list[tuple[str, str]] = []

    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    # the small planner names a tool that does not exist, again and again
    async with ScriptedLLM(planner_script(seen, bad_model="m-small")) as base_url:
        code, out, err = await planweave("goal", "do it", "--model", "m-small", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--config", "cascade=true", "--journal", journal,
                                         "--json", cwd=tmp_path)
    assert code == 0, err
    assert seen == [("plan", "m-small"), ("plan", "m-small"), ("plan", "m-large"), ("join", "m-large")]
    run_id = json.loads(out)["run_id"]
    code, out, err = await planweave("show", run_id, "--journal", journal, "--json", cwd=tmp_path)
    assert code == 0, err
    ups = [e for e in json.loads(out)["escalations"] if e["rung"] == "escalate"]
    assert [(e["monitor"], e["from_tier"], e["to_tier"], e["cascade"]) for e in ups] == [
        ("stuck", "small", "large", "planner")]


def test_tiers_on_a_goal_run_without_cascade_exits_2_saying_what_it_would_do(tmp_path: Path) -> None:
    _, tiers = write(tmp_path, "cascade")
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["goal", "x", "--config", f"tiers={tiers}", "--journal", f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.exit_code == 2, result.output
    assert "key 'tiers': a goal run's planner uses tiers with cascade = true (it cascades over them)" in " ".join(
        result.output.split())
