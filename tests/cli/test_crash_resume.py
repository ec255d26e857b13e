"""A run killed with SIGKILL mid-plan resumes from its SQLite journal without running a finished step twice.

The plan's steps append their id to a side-effect file before they wait, so the file counts how often each step
really ran. The second step of every chain also waits for a gate file, which stays closed while the first process
runs: the test kills it once the journal shows the first steps succeeded and the second ones running, so the
moment of the crash is fixed, not raced. Then the run is resumed: the file proves that no step the journal had
recorded as finished ran again, and the journal shows which interrupted steps were re-run by themselves
(idempotent ones) and which waited for ``--retry-unknown`` (the others).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.kill import sigkill_when
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env

STEP_SECONDS = 0.2
# chain -> [(step id, tool, idempotent override)]; the second step of each chain waits at the gate.
CHAINS: dict[str, list[tuple[str, str, bool | None]]] = {
    "i": [("i1", "mark_idempotent", None), ("i2", "mark_idempotent", None), ("i3", "mark_idempotent", None)],
    "n": [("n1", "mark", None), ("n2", "mark", None), ("n3", "mark", None)],
    "s": [("s1", "shell", None), ("s2", "shell", None), ("s3", "shell", None)],
    "m": [("m1", "mark_idempotent", None), ("m2", "shell", None), ("m3", "mark", True)],
}
ALL_STEPS = {sid for chain in CHAINS.values() for sid, _, _ in chain} | {"join"}
FIRST = {chain[0][0] for chain in CHAINS.values()}  # {i1, n1, s1, m1}: finished before the kill
GATED = {chain[1][0] for chain in CHAINS.values()}  # {i2, n2, s2, m2}: running at the kill
IDEMPOTENT = {"i1", "i2", "i3", "m1", "m3", "join"}  # shell and plain `mark` steps are not


def crash_plan(log: Path, gate: Path) -> dict[str, Any]:
    """Four parallel chains of three steps, then a join: 13 steps, each appending its id to ``log``."""
    steps: list[dict[str, Any]] = []
    for chain in CHAINS.values():
        previous: str | None = None
        for sid, tool, idempotent in chain:
            gated = sid in GATED
            if tool == "shell":
                wait = 'while [ ! -e "$2" ]; do sleep 0.02; done; ' if gated else ""
                script = f'echo "$0" >> "$1"; {wait}sleep {STEP_SECONDS}'
                step: dict[str, Any] = {
                    "id": sid, "tool": "shell", "args": {"argv": ["sh", "-c", script, sid, str(log), str(gate)]},
                }
            else:
                args: dict[str, Any] = {"step": sid, "log": str(log), "seconds": STEP_SECONDS}
                if gated:
                    args["gate"] = str(gate)
                step = {"id": sid, "tool": tool, "args": args}
            if idempotent is not None:
                step["idempotent"] = idempotent
            if previous is not None:
                step["after"] = [previous]
            steps.append(step)
            previous = sid
    steps.append({"id": "join", "tool": "mark_idempotent", "after": [c[-1][0] for c in CHAINS.values()],
                  "args": {"step": "join", "log": str(log), "seconds": 0.05}})
    return {"name": "crashy", "steps": steps}


def planweave(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), cwd=cwd, env=subprocess_env(), capture_output=True, text=True,
                          timeout=90)


def show(cwd: Path, url: str, run_id: str) -> dict[str, Any]:
    shown = planweave(cwd, "show", run_id, "--journal", url, "--json")
    assert shown.returncode == 0, shown.stderr
    report: dict[str, Any] = json.loads(shown.stdout)
    return report


def statuses(report: dict[str, Any], status: str) -> set[str]:
    return {sid for sid, step in report["steps"].items() if step["status"] == status}


def outcomes(report: dict[str, Any], sid: str) -> list[str]:
    return [a["outcome"] for a in report["steps"][sid]["attempt_log"]]


def kill_mid_plan(tmp_path: Path, url: str, plan: Path) -> None:
    """Start the run and SIGKILL it once the journal shows the first steps succeeded and the gated ones running."""
    sigkill_when(
        cli_command("run", str(plan), "--journal", url, "--run-id", "crash", "--json",
                    "--tools", "crashy_tools:toolbox"),
        cwd=tmp_path, env=subprocess_env(), url=url, run_id="crash",
        ready=lambda state: all(state.records[s].status == "succeeded" for s in FIRST) and all(
            state.records[s].status == "running" for s in GATED),
        never="the run never reached the state to kill it in")


@pytest.mark.slow
def test_sigkilled_run_resumes_without_running_a_finished_step_twice(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    log = tmp_path / "effects.log"
    gate = tmp_path / "gate"
    plan = tmp_path / "crashy.yaml"
    plan.write_text(yaml.safe_dump(crash_plan(log, gate), sort_keys=False), encoding="utf-8")
    tools = ["--tools", "crashy_tools:toolbox"]

    try:
        kill_mid_plan(tmp_path, url, plan)
    finally:
        gate.touch()  # from now on gated steps pass; it also ends the killed run's orphaned shell steps

    killed = show(tmp_path, url, "crash")
    assert killed["status"] == "interrupted"
    assert statuses(killed, "succeeded") == FIRST
    assert statuses(killed, "running") == GATED
    unknown = GATED - IDEMPOTENT  # n2, s2, m2: their effects may or may not have happened
    assert unknown == {"n2", "s2", "m2"}

    # Resuming runs what it safely can: the idempotent i2 again, and everything not behind an unknown step.
    first = planweave(tmp_path, "resume", "crash", "--journal", url, *tools)
    assert first.returncode == 1, first.stdout + first.stderr
    for sid in unknown:
        assert f"'{sid}'" in first.stdout
    assert "planweave resume crash --retry-unknown" in first.stdout
    after_first = show(tmp_path, url, "crash")
    assert after_first["status"] == "failed"
    assert outcomes(after_first, "i2") == ["interrupted", "succeeded"]
    assert after_first["steps"]["i3"]["status"] == "succeeded"
    assert statuses(after_first, "unknown") == unknown
    assert statuses(after_first, "pending") == {"n3", "s3", "m3", "join"}

    second = planweave(tmp_path, "resume", "crash", "--journal", url, "--retry-unknown", *tools)
    assert second.returncode == 0, second.stdout + second.stderr

    final = show(tmp_path, url, "crash")
    assert final["status"] == "succeeded"
    assert statuses(final, "succeeded") == ALL_STEPS
    for sid in unknown:
        assert outcomes(final, sid) == ["interrupted", "succeeded"]

    runs = Counter(log.read_text().split())
    # Steps finished before the kill ran once; the ones running at the kill twice (once per process); the
    # rest once. In particular, no step the journal recorded as finished ran again.
    expected = {sid: 2 if sid in GATED else 1 for sid in ALL_STEPS}
    assert dict(runs) == expected
