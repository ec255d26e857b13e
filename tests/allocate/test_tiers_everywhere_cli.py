"""Tier tables and deadline pressure from the command line: ``run --tiers`` journals the table, ``resume`` allocates
from it (``resume --tiers`` replaces it), and ``run --deadline-pressure`` drops a late plan's optional steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import planweave.forecast.live as live_module
from planweave.cli.main import app
from planweave.journal import open_journal
from planweave.limits import JournaledLimits
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from tests.allocate.conftest import run_planweave as planweave
from tests.allocate.test_pressure import LATE

TIERS = {
    "small": {"model": "m-small", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
OTHER = {name: {**tier, "model": f"{tier['model']}-v2"} for name, tier in TIERS.items()}
# 'bad' fails at once and stops the run: 'slow' is cancelled (resumable) and 'a' never starts, so its allocation
# happens in the resume.
PLAN = {"steps": [
    {"id": "bad", "tool": "python", "args": {"function": "json:loads", "kwargs": {"s": "{"}}},
    {"id": "slow", "tool": "sleep", "args": {"seconds": 0.3}},
    {"id": "a", "tool": "llm", "after": ["slow"], "args": {"prompt": "a?", "model": "auto",
                                                           "tiers": ["small", "large"], "max_tokens": 10}},
]}


def answer(request: RecordedRequest) -> Reply:
    return Text(f"from {request.body['model']}")


async def events_of(journal: str, run_id: str) -> list[Any]:
    async with open_journal(journal) as opened:
        return list(await opened.read(run_id))


@pytest.mark.parametrize("again", [None, "other"])
async def test_resume_allocates_from_the_journaled_tiers_or_from_tiers_given_again(tmp_path: Path,
                                                                                  again: str | None) -> None:
    plan, tiers, other = tmp_path / "plan.yaml", tmp_path / "tiers.yaml", tmp_path / "other.yaml"
    plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    other.write_text(yaml.safe_dump(OTHER), encoding="utf-8")
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(answer) as base_url:
        code, out, err = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--journal", journal, "--json", cwd=tmp_path)
        assert code == 1, err
        run_id = json.loads(out)["run_id"]
        first = await events_of(journal, run_id)
        extra = ["--config", f"tiers={other}"] if again else []
        code, out, err = await planweave("resume", run_id, "--base-url", base_url, "--journal", journal, "--json",
                                         *extra, cwd=tmp_path)
    assert code == 1, err  # 'bad' still failed
    recorded = JournaledLimits.from_events(first)
    assert recorded.tiers == {name: {"duration_sigma": 0.0, "tokens": 0, **tier} for name, tier in TIERS.items()}
    assert not [e for e in first if e.kind == "allocation"]
    events = await events_of(journal, run_id)
    (allocation,) = [e for e in events if e.kind == "allocation"]
    models = {t["model"] for t in (OTHER if again else TIERS).values()}
    assert allocation.step == "a" and allocation.data["model"] in models
    assert json.loads(out)["steps"]["a"]["status"] == "succeeded"


def test_resume_tiers_on_a_run_without_a_model_exits_2(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"steps": [
        {"id": "bad", "tool": "python", "args": {"function": "json:loads", "kwargs": {"s": "{"}}}]}),
        encoding="utf-8")
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    journal = f"sqlite:///{tmp_path / 'r.db'}"
    ran = runner.invoke(app, ["run", str(tmp_path / "p.yaml"), "--journal", journal, "--run-id", "r1", "--json"])
    assert ran.exit_code == 1, ran.output
    result = runner.invoke(app, ["resume", "r1", "--config", f"tiers={tmp_path / 't.yaml'}", "--journal", journal])
    assert result.exit_code == 2, result.output
    assert "key 'tiers' applies to the model a run calls" in " ".join(result.output.split())


def test_run_with_deadline_pressure_drops_the_optional_steps_of_a_late_plan(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # On the virtual clock the forecasts' share of wall time grows no allowance: give every refresh room, so the
    # forecast after 'a' ends is made (what is tested here is the command line's wiring, not that budget).
    monkeypatch.setattr(live_module, "INITIAL_ALLOWANCE_S", 60.0)
    plan = tmp_path / "late.yaml"
    plan.write_text(yaml.safe_dump(LATE), encoding="utf-8")
    journal = f"sqlite:///{tmp_path / 'r.db'}"
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    pressed = runner.invoke(app, ["run", str(plan), "--journal", journal, "--virtual-clock", "--deadline", "9",
                                  "--config", "deadline_pressure=0.5", "--run-id", "pressed", "--json"])
    late = runner.invoke(app, ["run", str(plan), "--journal", journal, "--virtual-clock", "--deadline", "9",
                               "--run-id", "late", "--json"])
    shown = runner.invoke(app, ["show", "pressed", "--journal", journal])
    assert pressed.exit_code == 0, pressed.output
    report = json.loads(pressed.stdout)
    assert report["status"] == "succeeded"
    assert report["steps"]["extra"]["status"] == "cancelled"
    assert late.exit_code != 0 and json.loads(late.stdout)["status"] == "cancelled"
    assert "deadline_pressure: P(in time) 0% below 50%: dropped the optional extra, extra_after" in shown.output


def test_the_plans_own_pressure_section_acts_without_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_module, "INITIAL_ALLOWANCE_S", 60.0)  # as above
    plan = tmp_path / "late.yaml"
    plan.write_text(yaml.safe_dump({**LATE, "pressure": {"p_deadline": 0.9, "actions": ["drop_optional"]}}),
                    encoding="utf-8")
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    journal = f"sqlite:///{tmp_path / 'r.db'}"
    result = runner.invoke(app, ["run", str(plan), "--journal", journal, "--virtual-clock", "--deadline", "9",
                                 "--run-id", "own", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(runner.invoke(app, ["show", "own", "--journal", journal, "--json"]).stdout)
    assert report["status"] == "succeeded" and report["steps"]["extra"]["status"] == "cancelled"
    (escalation,) = report["escalations"]
    assert (escalation["action"], escalation["threshold"]) == ("drop_optional", 0.9)


@pytest.mark.parametrize(("extra", "message"), [
    (["--config", "deadline_pressure=0.5"],
     "--config deadline_pressure=0.5: key 'deadline_pressure' acts when the forecast of the time left falls below it"),
    (["--config", "deadline_pressure=1.5", "--deadline", "9"],
     "key 'deadline_pressure': expected a probability above 0"),
])
def test_a_bad_deadline_pressure_exits_2_naming_it(tmp_path: Path, extra: list[str], message: str) -> None:
    plan = tmp_path / "late.yaml"
    plan.write_text(yaml.safe_dump(LATE), encoding="utf-8")
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["run", str(plan), "--journal", f"sqlite:///{tmp_path / 'r.db'}", *extra])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
