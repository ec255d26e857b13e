"""``planweave run`` reuses cached outputs across processes sharing a journal; ``--no-cache`` runs every step;
``planweave show`` marks the steps served from the cache.

Also the toolbox those processes load (``--tools test_result_cache_cli:toolbox``, this directory on PYTHONPATH): a
cacheable tool that appends a line to a file per real invocation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from planweave import Toolbox

HERE = Path(__file__).parent


def square(x: int, log: str) -> dict[str, int]:
    """x squared; each real call appends a line to ``log``."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{x}\n")
    return {"y": x * x}


toolbox = Toolbox()
toolbox.add(square, idempotent=True, cache=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_run_reuses_cached_outputs_across_processes_and_no_cache_runs_every_step(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [
        {"id": "a", "tool": "square", "args": {"x": 3, "log": str(log)}},
        {"id": "b", "tool": "square", "args": {"x": "${a.y}", "log": str(log)}},
    ]}), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    common = ["--journal", url, "--tools", "test_result_cache_cli:toolbox", "--json"]

    runs = [cli("run", str(plan), "--run-id", run_id, *common, *extra)
            for run_id, extra in (("one", []), ("two", []), ("three", ["--config", "cache=false"]))]
    calls_after = log.read_text(encoding="utf-8").split()
    shown = cli("show", "two", "--journal", url)
    plain = cli("show", "three", "--journal", url)
    step = cli("show", "two", "--step", "b", "--journal", url)
    detail = json.loads(cli("show", "two", "--step", "b", "--journal", url, "--json").stdout)

    assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr for r in runs]
    outputs = [json.loads(r.stdout)["outputs"] for r in runs]
    assert outputs[0] == outputs[1] == outputs[2] == {"a": {"y": 9}, "b": {"y": 81}}
    assert calls_after == ["3", "9", "3", "9"]  # run two called nothing; run three (--no-cache) everything
    assert shown.returncode == 0 and "(cached: one/a)" in shown.stdout and "(cached: one/b)" in shown.stdout
    assert "cached" not in plain.stdout
    assert "cached: the output of run one step b" in step.stdout
    assert [a.get("cache", {}).get("run") for a in detail["attempts"]] == ["one"]
