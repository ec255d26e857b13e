"""On Ray a step's ``heartbeat:`` idle timer starts when its task starts, not when it is submitted."""

from __future__ import annotations

from pathlib import Path

from planweave.executors.ray import RayExecutor
from tests.ray import heartbeat_tools
from tests.ray.test_ray_steps import run

HOLD_S = 2.0
HEARTBEAT_S = 0.5


def test_a_task_queued_by_ray_is_not_timed_out_before_it_starts_a_silent_one_is(ray_address: str,
                                                                                 tmp_path: Path) -> None:
    # The cluster has one "gizmo" (tests/ray/conftest.py); the engine is told of two, so it submits "queued" while
    # "hold" has Ray's only gizmo: Ray keeps "queued" waiting ~HOLD_S, longer than its heartbeat period.
    hold, queued = tmp_path / "hold", tmp_path / "queued"
    doc = {"on_failure": "continue", "capacities": {"gizmo": 2}, "steps": [
        {"id": "hold", "tool": "hold", "args": {"log": str(hold), "seconds": HOLD_S}, "resources": {"gizmo": 1}},
        {"id": "holding", "tool": "wait_for", "args": {"path": f"{hold}.started"}, "executor": "local"},
        {"id": "queued", "tool": "quick", "args": {"log": str(queued)}, "after": ["holding"],
         "resources": {"gizmo": 1}, "heartbeat": HEARTBEAT_S},
        {"id": "hung", "tool": "silent", "args": {"seconds": HEARTBEAT_S * 6}, "heartbeat": HEARTBEAT_S},
    ]}
    result, events = run(doc, RayExecutor(ray_address), tools=heartbeat_tools.tools())
    failed = {e.step: e.data for e in events if e.kind == "step_failed"}
    assert set(failed) == {"hung"}, failed
    assert failed["hung"]["kind"] == "timeout" and f"no heartbeat for {HEARTBEAT_S:g}s" in failed["hung"]["error"]
    assert result.outputs == {"hold": "held", "holding": f"{hold}.started", "queued": "quick"}
    # "queued" really waited for the gizmo: it started only once "hold" had ended.
    assert float(queued.read_text()) >= float(Path(f"{hold}.ended").read_text())
