"""Issue 27, part 5: a goal run is listed under its goal (on one line, cut to fit) in ``runs`` and ``show``, as a
plan file's run is under its plan's name."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env

GOAL = ("Compare tomorrow's weather in Paris and Rome\nand recommend one, with a short reason for the choice and a "
        "packing list")
SHOWN = "Compare tomorrow's weather in Paris and Rome and recommend…"


def test_a_goal_run_is_named_by_its_goal_cut_to_fit(tmp_path: Path) -> None:
    (tmp_path / "script.yaml").write_text(yaml.safe_dump({"plan": [{"id": "a", "tool": "noop"}]}), encoding="utf-8")
    url = sqlite_url(tmp_path)
    env = subprocess_env()

    def planweave(*args: str) -> str:
        done = subprocess.run(cli_command(*args, "--journal", url), env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    planweave("goal", GOAL, "--model", "scripted:script.yaml", "--run-id", "g")

    assert len(SHOWN) <= 60
    assert json.loads(planweave("runs", "--json"))[0]["plan"] == SHOWN
    assert json.loads(planweave("show", "g", "--json"))["plan"] == SHOWN
    assert SHOWN in planweave("runs")
    assert planweave("show", "g").startswith(f"run g · {SHOWN} · succeeded")
