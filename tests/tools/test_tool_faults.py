"""Tools raising what is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``) fail their step only."""

from __future__ import annotations

from typing import Any

import pytest

from planweave import Event, RunResult, Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from tests.cli.exit_tools import exit_async, exit_sync, interrupt_async, interrupt_sync


def faulty_tools() -> Toolbox:
    box = builtin_tools()
    for fn in (exit_async, exit_sync, interrupt_async, interrupt_sync):
        box.add(fn)
    return box


def run_plan(doc: dict[str, Any]) -> tuple[RunResult, list[Event]]:
    """Run ``doc`` on the virtual clock; return its result and its journaled events."""

    async def go() -> tuple[RunResult, list[Event]]:
        async with open_engine("memory://", clock=VirtualClock(), tools=faulty_tools()) as engine:
            run = await engine.start(doc)
            result = await run.wait()
            return result, list(await engine.journal.read(run.id))

    return run_virtual(go())


@pytest.mark.parametrize(("tool", "kind", "message"), [
    ("exit_async", "exit", "SystemExit(3)"),
    ("exit_sync", "exit", "SystemExit(3)"),
    ("interrupt_async", "interrupted", "KeyboardInterrupt"),
    ("interrupt_sync", "interrupted", "KeyboardInterrupt"),
])
def test_a_tool_raising_a_base_exception_fails_its_step(tool: str, kind: str, message: str) -> None:
    result, events = run_plan({"on_failure": "continue", "steps": [
        {"id": "bad", "tool": tool, "retries": 2},
        {"id": "other", "tool": "sleep", "args": {"seconds": 5}},
        {"id": "later", "tool": "noop", "after": ["bad"]},
    ]})
    assert result.status == "failed"
    bad = result.state.records["bad"]
    assert bad.status == "failed"
    assert bad.attempts == 1  # not retried by a policy of `error`: the tool asked to stop
    summary = result.summary["steps"]
    assert message in (summary["bad"]["error"] or "")
    assert result.state.records["other"].status == "succeeded"
    assert result.state.records["later"].status == "skipped"
    assert [(e.data["kind"], e.data["final"]) for e in events if e.kind == "step_failed"] == [(kind, True)]


def test_an_explicit_retry_on_exit_retries_it() -> None:
    result, _ = run_plan({"steps": [{"id": "bad", "tool": "exit_sync", "retries": {"max": 2, "on": ["exit"],
                                                                               "backoff": 0}}]})
    assert result.status == "failed"
    assert result.state.records["bad"].attempts == 3
