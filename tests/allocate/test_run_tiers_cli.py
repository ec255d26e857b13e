"""planweave run plan.yaml --model M --tiers FILE: model: auto steps allocated from the command line, against the
scripted server in a real process; a bad tiers file or a misplaced --tiers exits 2 naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planweave.cli.main import app
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from tests.allocate.conftest import run_planweave as planweave

TIERS = {
    "small": {"model": "m-small", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
PLAN = {"steps": [{"id": "a", "tool": "llm", "retries": 4, "args": {
    "prompt": "a?", "model": "auto", "tiers": ["small", "large"], "max_tokens": 20}}]}


def write(tmp_path: Path) -> tuple[Path, Path]:
    plan, tiers = tmp_path / "plan.yaml", tmp_path / "tiers.yaml"
    plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    return plan, tiers


async def test_run_with_tiers_allocates_model_auto_steps_within_the_deadline(tmp_path: Path) -> None:
    plan, tiers = write(tmp_path)
    models: list[str] = []

    def script(request: RecordedRequest) -> Reply:
        models.append(request.body["model"])
        return Text("done")

    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(script) as base_url:
        # --deadline 18: small's retry (10 + 0.5 + 10 declared seconds) does not fit, so small is 90% and large (15 s)
        # 99%; without the deadline, small's retries make it as sure as large, and cheaper
        code, out, err = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--deadline", "18", "--journal", journal,
                                         "--json", cwd=tmp_path)
    assert code == 0, err
    assert models == ["m-large"]
    run_id = json.loads(out)["run_id"]
    code, out, err = await planweave("show", run_id, "--journal", journal, "--json", cwd=tmp_path)
    assert code == 0, err
    (decision,) = json.loads(out)["allocations"]
    assert decision["step"] == "a" and decision["tier"] == "large" and decision["model"] == "m-large"


@pytest.mark.parametrize(("tiers", "extra", "message"), [
    ({"small": {"model": "m", "p_success": 2, "duration_s": 1, "cost_usd": 0}}, ["--model", "m"],
     "tier 'small': p_success must be in [0, 1]"),
    ({"small": {"model": "m", "duration_s": 1, "cost_usd": 0}}, ["--model", "m"], "missing field 'p_success'"),
    (TIERS, [], "key 'tiers' applies to the model a plan file's llm steps call: give --model NAME too"),
])
def test_a_bad_tiers_file_or_a_tiers_without_model_exits_2_naming_it(
        tmp_path: Path, tiers: object, extra: list[str], message: str) -> None:
    plan, path = write(tmp_path)
    path.write_text(yaml.safe_dump(tiers), encoding="utf-8")
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["run", str(plan), "--config", f"tiers={path}", "--journal", f"sqlite:///{tmp_path / 'r.db'}", *extra])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert str(path) in result.output.replace("\n", "").replace("│", "")


def test_tiers_with_a_goal_exits_2(tmp_path: Path) -> None:
    _, path = write(tmp_path)
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["goal", "x", "--config", f"tiers={path}", "--journal", f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.exit_code == 2 and "a goal run's planner uses tiers with cascade = true" in " ".join(
        result.output.split())
