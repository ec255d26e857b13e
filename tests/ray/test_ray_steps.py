"""Steps on a real Ray cluster: placement, resources, retries, redaction, and what cannot ship."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, Event, RunResult, Toolbox
from planweave.engine.executor import Executor
from planweave.executors.ray import RayExecutor, ray_options, tool_reference
from planweave.journal.memory import MemoryJournal
from planweave.tools.safety import SecretRedactor
from tests.ray import ray_tools


def run(doc: Mapping[str, Any], executor: Executor, tools: Toolbox | None = None, stored: dict[str, Any] | None = None,
        **engine: Any) -> tuple[RunResult, list[Event]]:
    """Run ``doc`` to its end; return the result and the events (``stored`` gets the journaled outputs)."""

    async def go() -> tuple[RunResult, list[Event]]:
        journal = MemoryJournal()
        async with Engine(journal, tools=tools or ray_tools.toolbox(), executor=executor, **engine) as eng:
            result = await (await eng.start(doc)).wait()
        events = await journal.read(result.run_id)
        refs = {e.step: e.data["output"] for e in events if e.kind == "step_succeeded" and e.step}
        blobs = await journal.get_blobs(refs.values())
        if stored is not None:
            stored.update({sid: blobs[ref] for sid, ref in refs.items()})
        return result, events

    return asyncio.run(go())


def test_steps_run_where_they_say_and_get_the_ray_resources_they_claim(ray_address: str) -> None:
    doc = {"capacities": {"cpu": 2, "gizmo": 1}, "steps": [
        {"id": "default", "tool": "where"},
        {"id": "claims", "tool": "where", "resources": {"cpu": 2, "gizmo": 1}},
        {"id": "here", "tool": "where", "executor": "local"},
    ]}
    result, _ = run(doc, RayExecutor(ray_address))
    assert result.ok, result.error
    out = result.outputs
    assert out["here"]["pid"] == os.getpid() and out["here"]["assigned"] == {}
    assert out["default"]["pid"] != os.getpid() and out["claims"]["pid"] != os.getpid()
    assert out["default"]["assigned"] == {"CPU": 1.0}
    assert out["claims"]["assigned"] == {"CPU": 2.0, "gizmo": 1.0}
    assert [out[s]["step"] for s in ("default", "claims", "here")] == ["default", "claims", "here"]


def test_a_local_default_sends_only_the_steps_that_say_ray(ray_address: str) -> None:
    doc = {"steps": [{"id": "a", "tool": "where"}, {"id": "b", "tool": "where", "executor": "ray"}]}
    result, _ = run(doc, RayExecutor(ray_address, default="local"))
    assert result.ok, result.error
    assert result.outputs["a"]["pid"] == os.getpid() != result.outputs["b"]["pid"]


def test_retries_and_redaction_hold_on_ray(ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_RAY_TEST_TOKEN", "s3cr3t-value")
    doc = {"steps": [{"id": "f", "tool": "flaky", "retries": {"max": 1, "backoff": 0.01},
                      "args": {"counter": str(tmp_path / "n"), "token": "s3cr3t-value"}}]}
    stored: dict[str, Any] = {}
    result, events = run(doc, RayExecutor(ray_address), redact=SecretRedactor(), stored=stored)
    assert result.ok, result.error
    assert result.outputs["f"] == {"calls": 2, "token": "s3cr3t-value"}  # the live value; the journal hides it
    assert stored == {"f": {"calls": 2, "token": "***"}}
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert [(f["kind"], f["final"]) for f in failed] == [("ConnectionError", False)]
    assert "s3cr3t-value" not in failed[0]["error"] and "***" in failed[0]["error"]


def test_a_tool_that_cannot_ship_is_refused_naming_it(ray_address: str) -> None:
    box = ray_tools.toolbox()

    async def closure() -> str:
        """Defined in a test: no worker can import it."""
        return "never"

    box.add(closure)
    result, events = run({"on_failure": "continue", "steps": [{"id": "c", "tool": "closure"},
                                                              {"id": "ok", "tool": "where"}]}, RayExecutor(ray_address),
                         tools=box)
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert result.outputs.keys() == {"ok"}
    assert [(f["kind"], f["final"]) for f in failed] == [("arguments", True)]
    assert "tool 'closure' cannot run on Ray" in failed[0]["error"] and "executor: local" in failed[0]["error"]


def test_references_name_the_function_or_the_toolbox() -> None:
    box = ray_tools.toolbox()
    assert tool_reference(box["where"]).target == "tests.ray.ray_tools:where"
    http = tool_reference(box["http.get"])
    assert (http.kind, http.target, http.name) == ("toolbox", "planweave.tools:builtin_tools", "http.get")
    assert ray_options({"cpu": 3, "gpu": 1, "memory": 2, "gizmo": 4}, 1.0) == {
        "num_cpus": 3, "num_gpus": 1, "memory": 2 << 20, "resources": {"gizmo": 4}}
    assert ray_options({}, 0.5) == {"num_cpus": 0.5}


def test_an_engine_without_ray_refuses_a_step_that_says_ray() -> None:
    from planweave.engine.executor import InProcessExecutor

    result, events = run({"steps": [{"id": "r", "tool": "where", "executor": "ray"}]}, InProcessExecutor())
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert result.status == "failed"
    assert failed[0]["kind"] == "arguments" and "step 'r' says executor: ray" in failed[0]["error"]


def test_executor_ray_without_the_ray_extra_names_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "one.yaml").write_text("steps:\n  - {id: a, tool: noop}\n")
    code = ("import sys\nsys.modules['ray'] = None\n"
            "sys.argv = ['planweave', 'run', 'one.yaml', '--journal', 'memory://', '--config', 'executor=ray']\n"
            "from planweave.cli.main import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "needs the 'ray' extra: pip install 'planweave[ray]'" in proc.stderr and "Traceback" not in proc.stderr
