"""The run read model shared by the CLI and the server: outputs, truncation, redaction and one step's detail."""

from __future__ import annotations

import functools
import hashlib
import json

import pytest

from planweave import VirtualClock, open_engine, run_virtual
from planweave.engine.report import StepNotFound, outputs_summary, shown_output, step_detail
from planweave.tools.safety import redact

from .conftest import Recorder, run_plan

SECRET = "sk-live-0123456789"
PLAN = {
    "on_failure": "continue",
    "steps": [
        {"id": "fetch", "tool": "work", "args": {"name": "fetch", "result": {"n": 2, "token": SECRET}}},
        {"id": "flaky", "tool": "work", "args": {"name": "flaky", "fail_times": 1, "result": "ok"},
         "retries": {"max": 2, "backoff": 0.1}},
        {"id": "use", "tool": "noop", "args": {"n": "${fetch.n}", "key": "${fetch.token}", "said": "${flaky}"}},
        {"id": "broken", "tool": "work", "args": {"name": "broken", "fail_times": 5}},
        {"id": "after_broken", "tool": "noop", "args": {"x": "${broken.name}"}},
    ],
}
hide = functools.partial(redact, secrets=[SECRET])


def test_outputs_summary_holds_succeeded_steps_only_redacted(recorder: Recorder) -> None:
    result = run_plan(PLAN, recorder.toolbox())
    outputs = outputs_summary(result.state, result.outputs, redact=hide)
    assert set(outputs) == {"fetch", "flaky", "use"}
    assert outputs["fetch"] == {"n": 2, "token": "***"}
    assert outputs["flaky"] == "ok"


def test_a_big_output_is_a_marker_with_size_and_hash() -> None:
    big = {"text": "x" * 2000}
    marker = shown_output(big, limit=1000)
    data = json.dumps(big, separators=(",", ":"), sort_keys=True).encode()
    assert marker == {"truncated": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert shown_output(big, limit=None) == big
    assert shown_output(big, limit=len(data)) == big


def test_step_detail_gives_rendered_args_every_attempt_and_the_output(recorder: Recorder) -> None:
    result = run_plan(PLAN, recorder.toolbox())
    detail = step_detail(result.state, result.outputs, "use", redact=hide)
    assert detail["status"] == "succeeded"
    assert detail["args"] == {"n": 2, "key": "***", "said": "ok"}
    assert detail["args_resolved"] is True
    assert len(detail["attempts"]) == 1

    flaky = step_detail(result.state, result.outputs, "flaky")
    assert [a["outcome"] for a in flaky["attempts"]] == ["failed", "succeeded"]
    assert flaky["output"] == "ok"


def test_step_detail_of_a_skipped_step_shows_its_args_as_written(recorder: Recorder) -> None:
    result = run_plan(PLAN, recorder.toolbox())
    detail = step_detail(result.state, result.outputs, "after_broken")
    assert detail["status"] == "skipped"
    assert detail["args"] == {"x": "${broken.name}"}
    assert detail["args_resolved"] is False
    assert detail["output"] is None
    broken = step_detail(result.state, result.outputs, "broken")
    assert broken["status"] == "failed"
    assert "broken flaked" in broken["error"]


def test_an_unknown_step_is_named_with_a_suggestion(recorder: Recorder) -> None:
    result = run_plan(PLAN, recorder.toolbox())
    with pytest.raises(StepNotFound, match=r"has no step 'fech' \(did you mean 'fetch'\?\)"):
        step_detail(result.state, result.outputs, "fech")


def test_with_the_events_each_failed_attempt_carries_its_error(recorder: Recorder) -> None:
    async def go() -> dict[str, object]:
        async with open_engine("memory://", clock=VirtualClock(), tools=recorder.toolbox()) as engine:
            run = await engine.start(PLAN)
            result = await run.wait()
            events = await engine.journal.read(run.id)
            return step_detail(result.state, result.outputs, "flaky", events=events)

    detail = run_virtual(go())
    attempts = detail["attempts"]
    assert isinstance(attempts, list)
    assert [(a["outcome"], a["error"]) for a in attempts] == [("failed", "ConnectionError: flaky flaked"),
                                                              ("succeeded", None)]
