"""``planweave run --goal`` and ``planweave serve`` build their planning loops one way: the same limits give the same
budget, deadline and planning options, and a zero budget is a budget on both."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from planweave import VirtualClock, builtin_tools
from planweave.cli.run_cmd import AgentFlags
from planweave.engine.runtime import Engine
from planweave.journal import open_journal
from planweave.limits import RunLimits
from planweave.planning import PlanningLoop
from planweave.server.limits import open_server_model

UNREACHABLE = "http://127.0.0.1:9/v1"  # no call is made: the loops are only built


def _budget(loop: PlanningLoop) -> tuple[float | None, int | None] | None:
    return None if loop.budget is None else (loop.budget.usd_limit, loop.budget.token_limit)


@pytest.mark.parametrize("limits", [
    RunLimits(budget_usd=0.0, budget_tokens=0),  # zero: every call refused, not "no budget"
    RunLimits(budget_tokens=0, deadline=12.5, max_replans=0),
    RunLimits(budget_usd=1.5, deadline=30.0, max_replans=2),
    RunLimits(),
])
async def test_the_cli_and_the_server_build_the_same_planning_loop(
    limits: RunLimits, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    tools = builtin_tools()
    async with open_journal("memory://") as journal, Engine(journal, clock=VirtualClock(), tools=tools) as engine, \
            AsyncExitStack() as stack:
        flags = AgentFlags("gpt-test", UNREACHABLE, limits.budget_usd, limits.budget_tokens, limits.deadline,
                           5 if limits.max_replans is None else limits.max_replans, 2048)
        cli = await flags.planning_loop(engine, stack, tools)
        server = (await open_server_model(stack, engine, "gpt-test", UNREACHABLE)).planning_loop(limits)
    assert cli.options == server.options
    assert cli.options.deadline_s == limits.deadline
    assert cli.options.max_replans == (5 if limits.max_replans is None else limits.max_replans)
    expected = None if limits.budget() is None else (limits.budget_usd, limits.budget_tokens)
    assert _budget(cli) == _budget(server) == expected
    assert "llm" in cli.tools and "llm" in server.tools


def test_a_goal_run_with_a_zero_token_budget_calls_no_model(tmp_path: Path) -> None:
    """The planner's first call does not fit in 0 tokens: the run stops naming the budget, and the (unreachable)
    model is never contacted."""
    done = subprocess.run(
        [sys.executable, "-m", "planweave.cli.main", "goal", "say hi", "--model", "gpt-test", "--base-url",
         UNREACHABLE, "--budget-tokens", "0", "--journal", "memory://", "--json", "--virtual-clock"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env={"OPENAI_API_KEY": "sk-test", "PATH": ""},
    )
    report = json.loads(done.stdout)
    assert report["status"] == "failed", done.stderr  # stopped by its budget: a failure
    assert "budget" in report["error"] and "unreachable" not in report["error"].lower()
