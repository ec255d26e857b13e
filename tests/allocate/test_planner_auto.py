"""planweave run --goal G --model auto --tiers FILE: the planner's tier chosen by the Monte Carlo allocator before
each of its calls, in a real process against the scripted server; journaled as allocation events of step
"planner" that show lists; --model auto without --tiers (or with --cascade) exits 2 naming it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planweave.cli.main import app
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from tests.allocate.conftest import Planweave, planner_script

# As likely as each other to write a good plan, small cheaper: small first; large takes over once small's plan is
# rejected (this run's own outcome, with the declared 95% as the prior: 1.9/3 = 63%)
TIERS = {
    "small": {"model": "m-small", "p_success": 0.95, "duration_s": 1, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.95, "duration_s": 2, "cost_usd": 0.001},
}


def write(tmp_path: Path, tiers: Mapping[str, object]) -> Path:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers), encoding="utf-8")
    return path


async def test_the_planners_tier_is_allocated_before_each_call_and_shown(tmp_path: Path,
                                                                       planweave: Planweave) -> None:
    tiers = write(tmp_path, TIERS)
    seen: list[tuple[str, str]] = []
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(planner_script(seen, bad_model="m-small")) as base_url:
        code, out, err = await planweave("goal", "do it", "--model", "auto", "--base-url", base_url,
                                         "--config", f"tiers={tiers}", "--journal", journal, "--json", cwd=tmp_path)
        assert code == 0, err
        run_id = json.loads(out)["run_id"]
        code, shown, err = await planweave("show", run_id, "--journal", journal, "--json", cwd=tmp_path)
        assert code == 0, err
        code, table, err = await planweave("show", run_id, "--journal", journal, cwd=tmp_path)
        assert code == 0, err
    assert seen == [("plan", "m-small"), ("plan", "m-large"), ("join", "m-large")]
    decisions = json.loads(shown)["allocations"]
    assert [(d["step"], d["tier"], d["model"]) for d in decisions] == [
        ("planner", "small", "m-small"), ("planner", "large", "m-large"), ("planner", "large", "m-large")]
    assert decisions[-1]["purpose"] == "join"
    first, second = ({c["tier"]: c for c in d["compared"]} for d in decisions[:2])
    assert first["small"]["p_all"] == first["large"]["p_all"]  # a tie: the cheaper
    assert second["large"]["p_all"] > second["small"]["p_all"]  # small's rejected plan counts against it
    assert "planner" in table and "large x1" in table


@pytest.mark.parametrize(("deadline", "model"), [([], "m-large"), (["--deadline", "20"], "m-small")])
async def test_a_deadline_the_strong_planner_cannot_meet_keeps_the_fast_one(
        tmp_path: Path, planweave: Planweave, deadline: list[str], model: str) -> None:
    # large answers surely but in 30 declared seconds: without a deadline, the surer; with 20 s, small (90%, 1 s)
    tiers = write(tmp_path, {"small": {**TIERS["small"], "p_success": 0.9},
                             "large": {**TIERS["large"], "p_success": 0.99, "duration_s": 30}})
    seen: list[tuple[str, str]] = []
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(planner_script(seen)) as base_url:
        code, _, err = await planweave("goal", "do it", "--model", "auto", "--base-url", base_url,
                                       "--config", f"tiers={tiers}", *deadline, "--journal", journal, "--json",
                                       cwd=tmp_path)
    assert code == 0, err
    assert seen == [("plan", model), ("join", model)]


@pytest.mark.parametrize("extra", [[], ["--config", "cascade=true"]])
def test_model_auto_for_a_goal_needs_tiers_and_no_cascade(tmp_path: Path, extra: list[str]) -> None:
    tiers = write(tmp_path, TIERS)
    flags = ["--config", f"tiers={tiers}", *extra] if extra else []
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(
        app, ["goal", "x", "--model", "auto", *flags, "--journal", f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.exit_code == 2, result.output
    assert "--model auto has the allocator choose the planner's tier" in " ".join(result.output.split())


async def test_a_killed_goal_run_with_an_allocated_planner_resumes_allocated(tmp_path: Path) -> None:
    import asyncio

    from tests.allocate.test_gaps_cascade_resume import kill_when_running
    from tests.allocate.test_pressure_goal_resume import planweave as start

    tiers = write(tmp_path, TIERS)
    seen: list[tuple[str, str]] = []
    plan = [{"id": "wait", "tool": "sleep", "args": {"seconds": 5}}]

    def script(request: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in request.messages)
        seen.append(("join" if "If the results answer the goal" in text else "plan", str(request.body["model"])))
        if seen[-1][0] == "join":
            return Text(json.dumps({"answer": "done"}))
        return Text("".join(json.dumps(s) + "\n" for s in plan))

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(script) as base_url:
        first = await start("goal", "g", "--model", "auto", "--base-url", base_url, "--config", f"tiers={tiers}",
                            "--journal", url, "--json", cwd=tmp_path)
        run_id = await kill_when_running(first, url, "wait")
        again = await start("resume", run_id, "--journal", url, "--model", "m-large", "--base-url", base_url,
                            "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(again.communicate(), 120)
        shown = await start("show", run_id, "--journal", url, "--json", cwd=tmp_path)
        shown_out, _ = await asyncio.wait_for(shown.communicate(), 120)
    assert again.returncode == 0, err.decode()
    assert json.loads(out)["answer"] == "done"
    # allocated again after the resume: the join decided (small, the cheaper of a tie), not --model's m-large
    # (a kill before the plan's end was journaled makes the resume ask the planner to finish it first: a second
    # "plan" call, allocated as well)
    assert seen[0] == ("plan", "m-small") and seen[-1] == ("join", "m-small")
    assert {model for _, model in seen} == {"m-small"} and len(seen) in (2, 3)
    decisions = json.loads(shown_out)["allocations"]
    shown_decisions = [(d["step"], d["purpose"], d["tier"]) for d in decisions]
    assert shown_decisions[0] == ("planner", "plan", "small") and shown_decisions[-1] == ("planner", "join", "small")
    assert len(shown_decisions) == len(seen) and {tier for _, _, tier in shown_decisions} == {"small"}
