"""Step defaults: the plan's `defaults:` fill what steps leave unset; plan files get a safe timeout at the CLI edge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planweave import RetryPolicy, parse_plan_document, validate_plan
from planweave.core.plan.defaults import (
    DEFAULT_STEP_TIMEOUT,
    check_seconds,
    may_wait_forever,
    unbounded_steps,
    with_default_timeout,
)
from planweave.core.plan.graph import Plan
from tests.engine.conftest import run_plan

DOC = {
    "defaults": {"timeout": 30, "retries": 2, "heartbeat": 10},
    "steps": [
        {"id": "plain", "tool": "noop"},
        {"id": "own", "tool": "noop", "timeout": 5, "retries": {"max": 0}, "heartbeat": 1},
        {"id": "forever", "tool": "noop", "timeout": None, "heartbeat": None},
        {"id": "ask", "tool": "human.input"},
        {"id": "approve", "tool": "noop", "approval": "go?"},
    ],
}


def effective(doc: dict[str, Any]) -> Plan:
    return validate_plan(parse_plan_document(doc))


def values(plan: Plan, sid: str) -> tuple[float | None, int, float | None]:
    step = plan.steps[sid]
    return step.timeout, step.retries.max, step.heartbeat


def test_steps_take_the_plan_defaults_for_what_they_leave_unset() -> None:
    plan = effective(DOC)
    assert values(plan, "plain") == (30, 2, 10)
    assert values(plan, "own") == (5, 0, 1)
    assert values(plan, "forever") == (None, 2, None)  # `null` on the step means no limit


def test_steps_that_wait_on_people_take_no_default_timeout() -> None:
    plan = effective(DOC)
    assert values(plan, "ask") == (None, 2, None)
    assert values(plan, "approve") == (None, 2, None)


def test_retry_policies_are_defaults_too() -> None:
    plan = effective({"defaults": {"retries": {"max": 3, "on": ["timeout"]}}, "steps": [{"id": "a", "tool": "noop"}]})
    assert plan.steps["a"].retries == RetryPolicy(max=3, on=("timeout",))


def test_defaults_survive_the_journaled_document() -> None:
    plan = effective(DOC)
    again = effective(json.loads(json.dumps(plan.to_document())))
    assert {sid: values(again, sid) for sid in again.order} == {sid: values(plan, sid) for sid in plan.order}


def test_plan_files_get_a_safe_default_timeout_that_the_cli_overrides() -> None:
    bare = parse_plan_document({"steps": [{"id": "a", "tool": "noop"}]})
    assert validate_plan(with_default_timeout(bare)).steps["a"].timeout == DEFAULT_STEP_TIMEOUT
    assert validate_plan(with_default_timeout(bare, 7)).steps["a"].timeout == 7
    own = parse_plan_document({"defaults": {"timeout": 20, "retries": 1}, "steps": [{"id": "a", "tool": "noop"}]})
    assert values(validate_plan(with_default_timeout(own)), "a") == (20, 1, None)
    assert values(validate_plan(with_default_timeout(own, 3)), "a") == (3, 1, None)
    unlimited = parse_plan_document({"defaults": {"timeout": None}, "steps": [{"id": "a", "tool": "noop"}]})
    assert validate_plan(with_default_timeout(unlimited)).steps["a"].timeout is None


def test_the_python_api_adds_no_timeout() -> None:
    assert effective({"steps": [{"id": "a", "tool": "noop"}]}).steps["a"].timeout is None


def test_steps_that_may_wait_forever() -> None:
    plan = effective({**DOC, "steps": [*DOC["steps"], {"id": "long", "tool": "noop", "timeout": 10**6}]})
    assert [sid for sid in plan.order if may_wait_forever(plan.steps[sid])] == ["forever", "ask", "approve", "long"]
    assert unbounded_steps(plan.steps[sid] for sid in plan.order) == ["forever", "ask", "approve", "long"]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 1e308])
def test_cli_seconds_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="--step-timeout must be"):
        check_seconds(bad, "--step-timeout")


def test_a_default_timeout_stops_a_hanging_tool() -> None:
    hang = {"id": "hang", "tool": "sleep", "args": {"seconds": 1e8}}
    result = run_plan({"defaults": {"timeout": 5}, "steps": [hang]})
    assert result.status == "failed"
    assert "timed out after 5s" in result.summary["steps"]["hang"]["error"]


def test_planweave_run_step_timeout_stops_a_hanging_tool(tmp_path: Path) -> None:
    plan = tmp_path / "hang.yaml"
    plan.write_text("steps: [{id: hang, tool: sleep, args: {seconds: 100000000}}]\n")
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    command = [sys.executable, "-m", "planweave.cli.main", "run", str(plan), "--json", "--virtual-clock",
               "--step-timeout", "2.5", "--journal", f"sqlite:///{tmp_path / 'j.db'}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "timed out after 2.5s" in done.stdout + done.stderr
    bad = subprocess.run([*command[:-4], "--step-timeout", "inf"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "--step-timeout must be" in bad.stderr and "Traceback" not in bad.stderr
