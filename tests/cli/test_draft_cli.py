"""``planweave goal ... --config draft_model=NAME``: the draft model drafts the plan, the planner verifies it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cli.model_process import scripted_model
from tests.cli.test_cli import cli_command, invoke, journal_view, sqlite_url, subprocess_env

GOAL_PLAN = [{"id": "a", "tool": "noop", "args": {"x": 1}},
             {"id": "b", "tool": "noop", "args": {"y": "${a.x}"}}]


@pytest.fixture
def model(tmp_path: Path) -> Iterator[str]:
    """A scripted model server process: its first two calls (the planner's and the draft's, in either order) write
    GOAL_PLAN, every later one (the joiner) answers."""
    with scripted_model(tmp_path / "script.jsonl", [GOAL_PLAN, GOAL_PLAN]) as url:
        yield url


def test_a_goal_run_with_a_draft_model_calls_it_and_keeps_the_planners_plan(tmp_path: Path, model: str) -> None:
    url = sqlite_url(tmp_path)
    done = subprocess.run(
        cli_command("goal", "count", "--model", "m", "--config", "draft_model=d", "--base-url", model,
                    "--journal", url, "--run-id", "g1", "--json"),
        cwd=tmp_path, env={**subprocess_env(), "OPENAI_API_KEY": "sk-test"}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "succeeded" and report["answer"] == "done"
    assert report["outputs"] == {"a": {"x": 1}, "b": {"y": 1}}
    seen = journal_view(url, "g1")
    assert seen is not None and seen.state is not None
    assert [(c["purpose"], c["model"]) for c in seen.state.model_calls if c["purpose"] in ("plan", "draft")] in (
        [("plan", "m"), ("draft", "d")], [("draft", "d"), ("plan", "m")])
    # Both replies come at once here: each draft step was either adopted or thrown away, never left open.
    assert {s["outcome"].split(":")[0] for s in seen.state.speculations} <= {"adopted", "discarded"}


def test_draft_model_is_refused_for_a_plan_file(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [{"id": "a", "tool": "noop", "args": {}}]}))
    result = invoke("run", str(plan), "--config", "draft_model=d", "--journal", "memory://")
    assert result.exit_code == 2
    assert "--config draft_model=d: key 'draft_model' applies to goal runs (planweave goal)" in result.output
