"""Retries with backoff, timeouts, raising and hanging tools, unserialisable outputs: no hang, clear errors."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from planweave import RetryPolicy, Toolbox, ToolError, builtin_tools
from tests.engine.conftest import JournalAt, Recorder, run_plan


def test_retries_until_success_with_exponential_backoff(recorder: Recorder, journal_at: JournalAt) -> None:
    result = run_plan({"steps": [{
        "id": "flaky", "tool": "work", "args": {"name": "flaky", "seconds": 1, "fail_times": 3},
        "retries": {"max": 3, "backoff": 2, "factor": 2, "jitter": 0},
    }]}, recorder.toolbox(), journal=journal_at)
    assert result.ok
    assert result.summary["steps"]["flaky"]["attempts"] == 4
    # attempt k ends at start+1; waits are 2, 4, 8 seconds
    assert recorder.starts["flaky"] == [0.0, 3.0, 8.0, 17.0]


def test_retries_exhausted_fail_with_the_last_error(recorder: Recorder, journal_at: JournalAt) -> None:
    result = run_plan({"steps": [{
        "id": "flaky", "tool": "work", "args": {"name": "flaky", "fail_times": 9}, "retries": {"max": 2, "backoff": 0},
    }]}, recorder.toolbox(), journal=journal_at)
    assert result.status == "failed"
    assert result.summary["steps"]["flaky"]["attempts"] == 3
    assert result.summary["steps"]["flaky"]["error"] == "ConnectionError: flaky flaked"


def test_jitter_is_deterministic_and_bounded() -> None:
    policy = RetryPolicy(max=5, backoff=10, factor=3, max_backoff=50, jitter=0.5)
    assert policy.delay(1, 0.0) == 5.0 and policy.delay(1, 0.999999) < 15.0
    assert policy.delay(3, 0.5) == 50.0  # capped
    a = run_plan({"steps": [{"id": "f", "tool": "work", "args": {"name": "f", "fail_times": 1},
                             "retries": {"max": 1, "backoff": 10, "jitter": 0.5}}]}, Recorder().toolbox(), run_id="r1")
    b = run_plan({"steps": [{"id": "f", "tool": "work", "args": {"name": "f", "fail_times": 1},
                             "retries": {"max": 1, "backoff": 10, "jitter": 0.5}}]}, Recorder().toolbox(), run_id="r1")
    assert a.summary["makespan_s"] == b.summary["makespan_s"]


def test_only_listed_error_kinds_are_retried(recorder: Recorder) -> None:
    result = run_plan({"steps": [{
        "id": "f", "tool": "work", "args": {"name": "f", "fail_times": 5}, "retries": {"max": 3, "on": ["timeout"]},
    }]}, recorder.toolbox())
    assert result.summary["steps"]["f"]["attempts"] == 1
    result = run_plan({"steps": [{
        "id": "f", "tool": "work", "args": {"name": "f", "fail_times": 1},
        "retries": {"max": 3, "on": ["ConnectionError"], "backoff": 0},
    }]}, Recorder().toolbox())
    assert result.ok and result.summary["steps"]["f"]["attempts"] == 2


def test_timeout_fails_a_hanging_tool_and_is_retried(recorder: Recorder, journal_at: JournalAt) -> None:
    result = run_plan({"steps": [
        {"id": "hang", "tool": "sleep", "args": {"seconds": 10**9}, "timeout": 5, "retries": {"max": 1, "backoff": 1,
                                                                                              "jitter": 0}},
        {"id": "after", "tool": "noop", "after": ["hang"]},
    ]}, recorder.toolbox(), journal=journal_at)
    assert result.status == "failed"
    hang = result.summary["steps"]["hang"]
    assert hang["attempts"] == 2 and hang["error"] == "timed out after 5s"
    assert result.summary["makespan_s"] == 11.0
    assert result.summary["steps"]["after"]["status"] == "skipped"


def test_raising_tools_never_crash_the_run(journal_at: JournalAt) -> None:
    box = builtin_tools()

    async def raises_base() -> None:
        raise KeyError("missing")

    async def raises_tool_error() -> None:
        raise ToolError("quota exhausted", kind="quota", retryable=False)

    async def raises_cancelled() -> None:
        raise asyncio.CancelledError("inner")

    def sync_raises() -> None:
        raise ValueError("from a thread")

    for fn in (raises_base, raises_tool_error, raises_cancelled, sync_raises):
        box.add(fn)
    result = run_plan({"steps": [
        {"id": "a", "tool": "raises_base", "retries": 2},
        {"id": "b", "tool": "raises_tool_error", "retries": 2},
        {"id": "c", "tool": "raises_cancelled"},
        {"id": "d", "tool": "sync_raises"},
        {"id": "ok", "tool": "noop"},
    ], "on_failure": "continue"}, box, journal=journal_at)
    steps = result.summary["steps"]
    assert steps["a"]["error"] == "KeyError: 'missing'" and steps["a"]["attempts"] == 3
    assert steps["b"]["error"] == "quota exhausted" and steps["b"]["attempts"] == 1
    assert "CancelledError" in steps["c"]["error"]
    assert steps["d"]["error"] == "ValueError: from a thread"
    assert steps["ok"]["status"] == "succeeded"


def test_unserialisable_output_fails_the_step_not_the_run(journal_at: JournalAt) -> None:
    box = builtin_tools()

    async def weird() -> Any:
        return {"lock": threading.Lock()}

    box.add(weird)
    result = run_plan({"steps": [{"id": "w", "tool": "weird", "retries": 3}, {"id": "n", "tool": "noop"}],
                       "on_failure": "continue"}, box, journal=journal_at)
    steps = result.summary["steps"]
    assert steps["w"]["status"] == "failed" and steps["w"]["attempts"] == 1
    assert "not JSON-serialisable" in steps["w"]["error"]
    assert steps["n"]["status"] == "succeeded"


def test_bad_reference_at_run_time_fails_clearly(journal_at: JournalAt) -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "noop", "args": {"items": []}},
        {"id": "b", "tool": "noop", "args": {"x": "${a.items[0]}"}, "retries": 3},
    ]}, journal=journal_at)
    b = result.summary["steps"]["b"]
    assert b["status"] == "failed" and b["attempts"] == 1
    assert b["error"] == "${a.items[0]}: a.items has no index 0 (a list of 0)"


def test_bad_argument_type_from_reference_fails_at_call_time() -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "noop", "args": {"n": "soon"}},
        {"id": "b", "tool": "sleep", "args": {"seconds": "${a.n}"}},
    ]})
    b = result.summary["steps"]["b"]
    assert b["status"] == "failed"
    assert b["error"].startswith("bad arguments for tool 'sleep': seconds:")


def test_tool_context_is_available() -> None:
    from planweave import current_step

    box: Toolbox = builtin_tools()

    async def who() -> dict[str, Any]:
        ctx = current_step()
        return {"run": ctx.run_id, "step": ctx.step_id, "attempt": ctx.attempt}

    box.add(who)
    result = run_plan({"steps": [{"id": "me", "tool": "who"}]}, box)
    assert result.outputs["me"] == {"run": result.run_id, "step": "me", "attempt": 1}


def test_fallback_runs_after_retries_are_exhausted(recorder: Recorder) -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "work", "args": {"name": "primary", "fail_times": 9}, "retries": {"max": 1, "backoff": 0},
         "fallback": {"tool": "noop", "args": {"via": "fallback"}}},
        {"id": "b", "tool": "noop", "args": {"got": "${a.via}"}},
    ]}, recorder.toolbox())
    assert result.ok
    assert result.outputs["b"] == {"got": "fallback"}
    assert result.summary["steps"]["a"]["attempts"] == 3  # two of the tool, one of the fallback
    assert [e["rung"] for e in result.state.escalations] == ["fallback"]


def test_a_failing_fallback_fails_the_step_with_its_error(recorder: Recorder) -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "work", "args": {"name": "primary", "fail_times": 9},
         "fallback": {"tool": "work", "args": {"name": "backup", "fail_times": 9}}},
    ]}, recorder.toolbox())
    assert result.status == "failed"
    assert result.summary["steps"]["a"]["error"] == "ConnectionError: backup flaked"
    assert recorder.calls == ["primary", "backup"]


def test_fallback_is_validated_like_a_step() -> None:
    import pytest

    from planweave import PlanInvalid, builtin_tools, parse_plan_document, validate_plan

    with pytest.raises(PlanInvalid) as info:
        validate_plan(parse_plan_document({"steps": [
            {"id": "a", "tool": "noop", "fallback": {"tool": "slep", "args": {"x": "${zz}"}}},
        ]}), builtin_tools(), {})
    text = str(info.value)
    assert "step 'a', fallback.args: ${zz} refers to unknown step 'zz'" in text
    assert "step 'a', fallback.tool: unknown tool 'slep' (did you mean 'sleep'?)" in text


def test_a_tool_that_stops_heartbeating_is_treated_as_hung() -> None:
    from planweave import current_step

    box = builtin_tools()

    async def crawl(pages: int, stall_after: int) -> int:
        for page in range(pages):
            if page == stall_after:
                await asyncio.sleep(10**6)  # hangs without a word
            await asyncio.sleep(3)  # each page takes 3 s: longer than the idle limit would allow without beats
            current_step().progress(page / pages, f"page {page}")
        return pages

    box.add(crawl)
    result = run_plan({"steps": [
        {"id": "ok", "tool": "crawl", "args": {"pages": 5, "stall_after": 99}, "heartbeat": 4},
        {"id": "stuck", "tool": "crawl", "args": {"pages": 5, "stall_after": 2}, "heartbeat": 4,
         "retries": {"max": 1, "backoff": 0, "on": ["timeout"]}},
    ]}, box)
    steps = result.summary["steps"]
    assert steps["ok"]["status"] == "succeeded"  # 15 s of work, never more than 3 s between beats
    assert steps["stuck"]["status"] == "failed" and steps["stuck"]["attempts"] == 2  # retried as a timeout
    assert steps["stuck"]["error"] == "no heartbeat for 4s: the tool is treated as hung"
    assert result.state.records["ok"].progress == (0.8, "page 4")


def test_heartbeats_from_a_sync_tool_in_a_thread_are_safe() -> None:
    import time as _time

    from planweave import current_step

    box = builtin_tools()

    def slow_sync(n: int) -> int:
        ctx = current_step()
        for i in range(n):
            _time.sleep(0.01)
            ctx.heartbeat()
            ctx.progress(i / n)
        return n

    box.add(slow_sync)
    result = run_plan({"steps": [{"id": "s", "tool": "slow_sync", "args": {"n": 5}, "heartbeat": 30}]}, box)
    assert result.ok and result.outputs["s"] == 5
