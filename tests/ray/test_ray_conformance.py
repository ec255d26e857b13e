"""The executor conformance suite (tests/engine/test_executor_conformance.py), over the Ray executor."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from planweave.engine.executor import Executor
from planweave.executors.ray import RayExecutor
from tests.engine import test_executor_conformance as suite


@pytest.fixture
def make_executor(ray_address: str) -> Callable[[], Executor]:
    return lambda: RayExecutor(ray_address)


@pytest.fixture
def heartbeat_s() -> float:
    # A Ray task's reports cross processes (a streaming generator's items). The idle timer starts when the task
    # reports it started (not on submission: RayExecutor.reports_start), but a beat can still lag on a loaded
    # 2-core machine, so the steps here beat against 0.2 s rather than the suite's 0.1 s.
    return 0.2


test_the_output_is_returned = suite.test_the_output_is_returned
test_exceptions_are_classified_as_in_process = suite.test_exceptions_are_classified_as_in_process
test_a_timeout_stops_the_call = suite.test_a_timeout_stops_the_call
test_cancelling_the_run_cancels_the_call_promptly = suite.test_cancelling_the_run_cancels_the_call_promptly
test_heartbeats_and_progress_reach_the_run = suite.test_heartbeats_and_progress_reach_the_run
