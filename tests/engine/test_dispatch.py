"""Event-driven dispatch: a step starts the moment its last dependency succeeds, by critical-path priority."""

from __future__ import annotations

from tests.engine.conftest import Recorder, run_plan


def work(sid: str, seconds: float, **extra: object) -> dict[str, object]:
    return {"id": sid, "tool": "work", "args": {"name": sid, "seconds": seconds}, **extra}


def test_step_starts_when_its_last_parent_finishes_not_later(recorder: Recorder) -> None:
    # No superstep barrier: 'c' waits only for 'a' (1s), not for the slow sibling 'b' (10s).
    result = run_plan({"steps": [
        work("a", 1), work("b", 10), work("c", 1, after=["a"]), work("d", 1, after=["b", "c"]),
    ]}, recorder.toolbox())
    assert result.ok
    assert recorder.starts["c"] == [1.0]
    assert recorder.starts["d"] == [10.0]
    assert result.summary["makespan_s"] == 11.0


def test_outputs_flow_through_references(recorder: Recorder) -> None:
    result = run_plan({"steps": [
        {"id": "a", "tool": "work", "args": {"name": "a", "result": {"items": [{"url": "u1"}, {"url": "u2"}]}}},
        {"id": "b", "tool": "noop", "args": {"url": "${a.items[1].url}", "all": "${a}"}},
    ]}, recorder.toolbox())
    assert result.outputs["b"] == {"url": "u2", "all": {"items": [{"url": "u1"}, {"url": "u2"}]}}


def test_longest_critical_path_goes_first(recorder: Recorder) -> None:
    # One slot: the step heading the longer chain starts first even though it is listed last.
    result = run_plan({"steps": [
        work("short", 1, estimate={"duration": 1}),
        work("long", 1, estimate={"duration": 1}),
        work("long2", 5, after=["long"], estimate={"duration": 5}),
    ]}, recorder.toolbox(), concurrency=1)
    assert result.ok
    # At t=1 'long2' (rank 5, ready at 1) still outranks 'short' (rank 1, waiting since 0): aging gives it 1 s.
    assert recorder.calls == ["long", "long2", "short"]
    assert recorder.starts == {"long": [0.0], "long2": [1.0], "short": [6.0]}


def test_aging_lets_old_ready_steps_through(recorder: Recorder) -> None:
    # 'old' has no estimate (rank 0) and becomes ready at t=0. A stream of high-rank steps keeps arriving,
    # but each second waited counts as a second of critical path, so 'old' runs before the late ones.
    steps = [work("old", 1)]
    prev = None
    for i in range(20):
        sid = f"hot{i}"
        steps.append(work(sid, 1, estimate={"duration": 3}, **({"after": [prev]} if prev else {})))
        prev = sid
    steps.append(work("hotroot", 1, estimate={"duration": 3}))
    result = run_plan({"steps": steps}, recorder.toolbox(), concurrency=1)
    assert result.ok
    assert recorder.starts["old"][0] < recorder.starts["hot19"][0]


def test_independent_branch_keeps_running_when_one_fails(recorder: Recorder) -> None:
    result = run_plan({"steps": [
        work("bad", 1, retries=0),
        {"id": "boom", "tool": "work", "args": {"name": "boom", "seconds": 1, "fail_times": 5}},
        work("after_boom", 1, after=["boom"]),
        work("grandchild", 1, after=["after_boom"]),
        work("other", 3),
        work("other2", 3, after=["other"]),
    ], "on_failure": "continue"}, recorder.toolbox())
    assert result.status == "failed"
    steps = result.summary["steps"]
    assert steps["boom"]["status"] == "failed"
    assert "ConnectionError: boom flaked" in steps["boom"]["error"]
    assert steps["after_boom"]["status"] == "skipped"
    assert steps["after_boom"]["error"] == "dependency 'boom' failed"
    assert steps["grandchild"]["status"] == "skipped"
    assert steps["other2"]["status"] == "succeeded"
    assert result.error is not None and result.error.startswith("step 'boom' failed: ConnectionError")
    assert "after_boom" not in recorder.starts


def test_empty_plan_succeeds_at_once() -> None:
    result = run_plan({"steps": []})
    assert result.ok and result.summary["steps"] == {}
