"""`--model-limits FILE`: the process's admission for model calls, its mistakes named; the live view's queue line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from planweave.cli.views import admission_lines
from planweave.models.admission import Admission, CallClass, EndpointLimits, default_admission, set_default_admission


def test_a_bad_model_limits_file_exits_2_naming_the_file_and_the_field(tmp_path: Path) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("gpt-4o-mini: {requests_per_minute: -5}\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps: [{id: a, tool: noop}]\n")
    config = tmp_path / "run.toml"
    config.write_text('model_limits = "limits.yaml"\n')  # read from the config file's folder
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", "run", str(plan), "--journal", "memory://",
                           "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert (f"{config}: key 'model_limits': {limits}: model 'gpt-4o-mini': requests_per_minute must be a whole "
            "number of at least 1, got -5") in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_serve_refuses_a_bad_model_limits_file_before_it_listens(tmp_path: Path) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("[not, a, mapping]\n")
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal",
                           "memory://", "--config", f"model_limits={limits}"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"key 'model_limits': {limits}: expected a mapping of model name to limits" in done.stderr


def test_the_model_limits_variable_sets_every_clients_admission(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("'*': {max_concurrency: 5, tokens_per_minute: 9000}\n")
    monkeypatch.setenv("PLANWEAVE_MODEL_LIMITS", str(limits))
    set_default_admission(None)
    try:
        admission = default_admission()
        assert admission is not None and admission.limits_for("any").tokens_per_minute == 9000
        assert default_admission() is admission  # read once
    finally:
        set_default_admission(None)


def test_the_live_view_shows_each_endpoints_queue_and_wait() -> None:
    # A model name no other test uses: the registry of live endpoints is the process's, and other tests' endpoints
    # for model "m" may still be alive when this runs.
    admission = Admission({"live-view-m": EndpointLimits(max_concurrency=1)})
    endpoint = admission.endpoint("http://127.0.0.1:1/v1", "live-view-m")
    seen: list[str] = []

    async def main() -> None:
        release = asyncio.Event()

        async def one() -> None:
            async with endpoint.slot(CallClass(), 1) as grant:
                await release.wait()
                grant.done(429)

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await asyncio.sleep(0.01)
        seen.append(" | ".join(line.plain for line in admission_lines() if "model live-view-m:" in line.plain))
        release.set()
        await asyncio.gather(*tasks)
        seen.append(" | ".join(line.plain for line in admission_lines() if "model live-view-m:" in line.plain))

    asyncio.run(main())
    assert seen[0].startswith("model live-view-m: 2 queued (oldest ") and " · 1/1 in flight · wait mean " in seen[0]
    assert seen[1].startswith("model live-view-m: 0 queued · 0/1 in flight") and seen[1].endswith("3 rate limited")


def test_resume_takes_model_limits_too_and_refuses_a_bad_file(tmp_path: Path) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("m: {max_concurrency: 0}\n")
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", "resume", "some-run", "--journal",
                           f"sqlite:///{tmp_path / 'runs.db'}", "--config", f"model_limits={limits}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"key 'model_limits': {limits}: model 'm': max_concurrency" in done.stderr and "Traceback" not in done.stderr
