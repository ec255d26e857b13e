"""Offline planning (docs/offline.md): each example script runs as a user runs it, a real ``planweave`` process with
``--model scripted:FILE``, and does what the docs say it shows, checked in the journal."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import cli_command, journal_view, sqlite_url, subprocess_env

REPO = Path(__file__).resolve().parents[2]
GOAL = "Compare tomorrow's weather in Paris and Rome and recommend one"


def goal_run(tmp_path: Path, script: str, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        cli_command("goal", GOAL, "--tools", "examples.weather:toolbox", "--model",
                    f"scripted:examples/offline/{script}", "--journal", sqlite_url(tmp_path), "--json", *extra),
        cwd=REPO, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["status"] == "succeeded"
    return report


def test_the_weather_script_streams_steps_into_execution_before_the_plan_is_written(tmp_path: Path) -> None:
    report = goal_run(tmp_path, "weather.yaml")
    first = report["plan_versions"][0]
    assert first["added"] == ["paris", "rome", "pick"]
    # streaming admission: paris started while the planner was still writing rome and pick
    assert report["steps"]["paris"]["started_at"] < first["model_finished_at"]
    assert report["answer"].startswith("Go with the recommendation")
    assert report["outputs"]["pick"]["recommend"] in {"Paris", "Rome"}


def test_the_repair_script_replaces_the_failed_step_and_keeps_the_rest(tmp_path: Path) -> None:
    report = goal_run(tmp_path, "repair.yaml")
    versions = report["plan_versions"]
    assert [v["trigger"] for v in versions] == ["initial", "local_repair"]
    assert "rome" in versions[1]["kept"]
    assert report["steps"]["rome"]["attempts"] == 1  # not re-run by the repair
    assert report["outputs"]["paris"]["city"] == "Paris"  # the replacement: the forecast tool
    # the replaced step's failed attempt is history too: a tool that fails and gets repaired is not "never failed"
    proc = subprocess.run(cli_command("estimates", "--tool", "http.get", "--journal", sqlite_url(tmp_path), "--json"),
                          cwd=REPO, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    (http_get,) = json.loads(proc.stdout)["estimates"]
    assert http_get["n"] >= 1 and http_get["success"]["beta"] > 1  # at least one failure seen


def test_the_replan_script_re_plans_on_an_observation_while_a_step_keeps_running(tmp_path: Path) -> None:
    report = goal_run(tmp_path, "replan.yaml")
    versions = report["plan_versions"]
    assert [v["trigger"] for v in versions] == ["initial", "observation"]
    assert versions[1]["adopted"] == ["slow"]  # running when the re-plan was spliced in, and kept running
    assert report["steps"]["slow"]["attempts"] == 1
    assert set(versions[1]["added"]) == {"rome", "pick"}
    assert report["steps"]["rome"]["started_at"] < report["steps"]["slow"]["finished_at"]  # concurrent


def wait_for(url: str, run_id: str, step: str, status: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = journal_view(url, run_id)
        record = seen.state.records.get(step) if seen is not None and seen.state is not None else None
        if record is not None and record.status == status:
            return
        assert proc.poll() is None, f"the run exited early with {proc.returncode}: {proc.communicate()}"
        time.sleep(0.1)
    pytest.fail(f"step '{step}' was not {status} within 60 s")


def test_the_approval_script_waits_for_a_person_then_runs(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    proc = subprocess.Popen(
        cli_command("goal", GOAL, "--tools", "examples.weather:toolbox", "--model",
                    "scripted:examples/offline/approval.yaml", "--journal", url, "--run-id", "trip", "--json"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        wait_for(url, "trip", "book", "waiting_approval", proc)
        approved = subprocess.run(cli_command("approve", "trip", "book", "--journal", url), cwd=REPO,
                                  capture_output=True, text=True, env=subprocess_env(), timeout=60)
        assert approved.returncode == 0, approved.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["status"] == "succeeded"
    assert report["outputs"]["book"]["city"] == report["outputs"]["pick"]["recommend"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read the script"),
    ("plan: 3\n", "plan: expected a list of steps"),
    ("plan: []\nreplies: []\n", "unknown key(s) replies"),
    ("answer: hi\n", "needs 'plan'"),
])
def test_a_bad_script_is_refused_before_the_run_naming_the_file(tmp_path: Path, content: str | None,
                                                                message: str) -> None:
    script = tmp_path / "script.yaml"
    if content is not None:
        script.write_text(content)
    proc = subprocess.run(cli_command("goal", "x", "--model", f"scripted:{script}", "--journal",
                                      sqlite_url(tmp_path)),
                          cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert str(script) in proc.stderr and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs.db").exists() or "started" not in proc.stderr  # no run was started


def test_the_demo_script_runs_hello_then_a_goal_offline() -> None:
    proc = subprocess.run(["bash", "scripts/demo.sh", "--journal", "memory://"], cwd=REPO, capture_output=True,
                          text=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "answer: Go with the recommendation" in proc.stdout
    assert proc.stdout.count("succeeded in") == 2
