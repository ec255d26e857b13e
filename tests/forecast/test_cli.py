"""``planweave estimates`` and ``planweave forecast`` as a user runs them: subprocesses, ``--json``, exit 2 on bad
input naming it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from planweave.journal import open_journal
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step

PLAN = """\
steps:
  - {id: a, tool: noop, args: {n: 1}, estimate: {duration: 2, cost: 0.5}}
  - {id: b, tool: noop, args: {n: 2}, after: [a], estimate: {duration: 3}}
  - {id: c, tool: noop, args: {n: 3}, after: [a], estimate: {duration: 1}}
"""
SLEEPS = """\
steps:
  - {id: a, tool: sleep, args: {seconds: 0.2}, estimate: {duration: 2, cost: 0.5}}
  - {id: b, tool: sleep, args: {seconds: 0.1}, after: [a], estimate: {duration: 3}}
  - {id: c, tool: sleep, args: {seconds: 0.1}, after: [a], estimate: {duration: 1}}
"""


def planweave(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=subprocess_env(), timeout=120)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_forecast_of_a_plan_file_prints_the_contract_object(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = as_json(planweave("forecast", str(plan), "--deadline", "5", "--budget-usd", "0.4", "--runs", "50",
                            "--journal", sqlite_url(tmp_path), "--json"))
    assert {"p_deadline", "p_budget", "p_success", "p_all", "makespan", "cost_usd", "critical_steps"} <= set(out)
    assert out["makespan"] == {"p50": 5.0, "p90": 5.0, "p99": 5.0}
    assert out["critical_steps"] == ["a", "b"]
    # an empty journal: how long is what the estimates say, whether it succeeds is unknown (null), not 100%
    assert (out["p_deadline"], out["p_budget"], out["p_success"], out["p_all"]) == (1.0, 0.0, None, None)
    assert out["history"] is False
    text = planweave("forecast", str(plan), "--deadline", "5", "--journal", sqlite_url(tmp_path))
    assert text.returncode == 0 and "in time (5s) 100%" in text.stdout and "a -> b" in text.stdout
    assert "succeeds: unknown (no history" in text.stdout


def test_estimates_and_forecast_of_a_journaled_run(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(SLEEPS)
    url = sqlite_url(tmp_path)
    run = as_json(planweave("run", str(plan), "--journal", url, "--virtual-clock", "--json"))
    table = as_json(planweave("estimates", "--journal", url, "--json"))
    tools = {e["name"]: e for e in table["estimates"] if e["kind"] == "tool"}
    assert tools["sleep"]["n"] == 3 and tools["sleep"]["duration"]["kind"] == "empirical"
    assert tools["sleep"]["success"] == {"alpha": 4.0, "beta": 1.0, "mean": 0.8}
    only = as_json(planweave("estimates", "--tool", "sleep", "--journal", url, "--json"))
    assert [e["kind"] for e in only["estimates"]] == ["tool"]
    done = as_json(planweave("forecast", run["run_id"], "--journal", url, "--json", "--runs", "10"))
    assert done["kind"] == "run" and done["p_success"] == 1.0
    assert done["makespan"]["p50"] == done["makespan"]["p99"] == done["elapsed"]  # nothing left to run


def test_bad_input_exits_2_naming_it(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    unknown = planweave("forecast", "nosuchrun", "--journal", url, "--json")
    assert unknown.returncode == 2 and "'nosuchrun' is neither a plan file nor a run" in unknown.stderr
    assert json.loads(unknown.stdout)["status"] == "error"
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {id: a, tool: sleep, after: [nope]}\n")
    invalid = planweave("forecast", str(bad), "--journal", url)
    assert invalid.returncode == 2 and "nope" in invalid.stderr and "Traceback" not in invalid.stderr
    missing = planweave("forecast", str(tmp_path / "gone.yaml"), "--journal", url)
    assert missing.returncode == 2 and "gone.yaml" in missing.stderr
    tool = planweave("estimates", "--tool", "nosuch", "--journal", url)
    assert tool.returncode == 2 and "'nosuch'" in tool.stderr
    kind = planweave("estimates", "--kind", "bogus", "--journal", url)
    assert kind.returncode == 2 and "--kind bogus" in kind.stderr
    claim = tmp_path / "claim.yaml"
    claim.write_text("steps:\n  - {id: a, tool: sleep, resources: {gpu: 1}}\n")
    refused = planweave("forecast", str(claim), "--journal", url)
    assert refused.returncode == 2 and "gpu" in refused.stderr and "Traceback" not in refused.stderr


def forecast_events(url: str, run_id: str) -> list[Any]:
    async def read() -> list[Any]:
        async with open_journal(url) as journal:
            return await journal.read(run_id)

    return [e for e in asyncio.run(read()) if e.kind in ("forecast", "run_resumed")]


def test_a_run_with_a_deadline_journals_its_forecast_and_a_resumed_one_goes_on(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps:\n"
                    "  - {id: a, tool: sleep, args: {seconds: 0.1}, estimate: {duration: 0.1}}\n"
                    "  - {id: b, tool: sleep, args: {seconds: 1.5}, after: [a], estimate: {duration: 1.5}}\n")
    url = sqlite_url(tmp_path)
    proc = subprocess.Popen(cli_command("run", str(plan), "--deadline", "100", "--run-id", "fr", "--journal", url),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=subprocess_env(), text=True)
    try:
        wait_for_step(url, "fr", "b", "running", proc)
    finally:
        proc.kill()
        proc.wait()
    before = forecast_events(url, "fr")
    assert before
    first = before[0].data  # estimates: 0.1 + 1.5 s from the run's start, forecast at `elapsed` into the run (a busy
    assert 1.5 <= first["makespan"]["p50"] <= first["elapsed"] + 1.7  # machine starts it later: not a fixed 1.6)
    assert before[0].data["deadline"] == 100.0 and before[0].data["p_deadline"] == 1.0
    resumed = planweave("resume", "fr", "--journal", url)
    assert resumed.returncode == 0, resumed.stderr
    after = forecast_events(url, "fr")[len(before):]
    assert after[0].kind == "run_resumed"
    forecasts = [e for e in after if e.kind == "forecast"]
    assert forecasts and forecasts[0].data["deadline"] == pytest.approx(100.0, abs=0.1)  # as started, from its start
    assert forecasts[0].data["elapsed"] > before[-1].data["elapsed"]
