"""`planweave run --goal` end to end on the bundled local model (llama.cpp's server, Gemma 3 270M), for real.

The model's plans are not useful (it is the base 270M model): what this checks is that the whole pipeline runs on
a real OpenAI-compatible server, streaming included, and that the run ends with a clear outcome instead of hanging.
Skipped without llama-cpp-python, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_local_model import _require_local_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_goal_run_on_the_local_model_ends_with_a_clear_outcome(tmp_path: Path) -> None:
    _require_local_model()
    done = subprocess.run(
        [sys.executable, "-m", "planweave.cli.main", "goal", "Say hello to Paris and to Rome.",
         "--model", "local", "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--deadline", "150",
         "--max-replans", "1", "--config", "plan_max_tokens=200", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, env={**os.environ}, check=False,
    )
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] in ("succeeded", "failed", "cancelled")
    assert done.returncode == (0 if report["status"] == "succeeded" else 1)
    assert report["tokens"] > 0  # the model was really called, and its usage journaled
    assert report["plan_versions"] and report["plan_versions"][0]["model_started_at"] is not None
    if report["status"] != "succeeded":
        assert report["error"]  # and if it failed, it says why
