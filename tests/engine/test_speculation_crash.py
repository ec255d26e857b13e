"""A run SIGKILLed while a speculative attempt is in flight resumes to the outputs it has without speculation.

The journal of the killed run holds ``speculation_started`` for ``b`` and nothing more of that attempt: the resume
must ignore it (``b`` is still pending, its attempt "interrupted" on the timeline) and end with the outputs of the
same plan run with speculation off. Every call appends its step to a side-effect file before it waits at a gate
(closed while the first process runs), so the moment of the kill is fixed, not raced.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave import Toolbox
from planweave.journal import open_journal
from tests.cli.crashy_tools import append_then_wait
from tests.cli.kill import env_with_root, sigkill_when
from tests.cli.test_cli import cli_command, sqlite_url


async def echo(step: str, log: str, value: Any = None, gate: str | None = None, seconds: float = 0.0
               ) -> dict[str, Any]:
    """Append ``step`` to ``log``, wait for the file ``gate`` (if given) and ``seconds``, return ``{step, value}``."""
    await append_then_wait(log, step, gate)
    await asyncio.sleep(seconds)
    return {"step": step, "value": value}


toolbox = Toolbox()
toolbox.add(echo, idempotent=True)


def plan(log: Path, gate: Path, speculation: str, seconds: float = 0.0) -> dict[str, Any]:
    common = {"log": str(log), "gate": str(gate)}
    return {
        "name": "speculative-crash",
        "speculation": {"mode": speculation, "min_confidence": 0},
        "steps": [
            {"id": "a", "tool": "echo", "args": {"step": "a", "value": 1, "seconds": seconds, **common},
             "predict": {"step": "a", "value": 1}},
            {"id": "b", "tool": "echo", "args": {"step": "b", "value": "${a.value}", **common}},
            {"id": "c", "tool": "echo", "args": {"step": "c", "value": "${b.value}", "log": str(log)}},
        ],
    }


def planweave(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), cwd=cwd, env=env_with_root(), capture_output=True, text=True, timeout=90)


TOOLS = ("--tools", "tests.engine.test_speculation_crash:toolbox")


def kill_while_speculating(cwd: Path, url: str, plan_file: Path) -> None:
    sigkill_when(cli_command("run", str(plan_file), "--journal", url, "--run-id", "crash", "--json", *TOOLS),
                 cwd=cwd, env=env_with_root(), url=url, run_id="crash",
                 ready=lambda state: any(e["step"] == "b" and e["outcome"] == "running" for e in state.speculations),
                 never="the run never started speculating")


async def outputs_and_kinds(url: str, run_id: str) -> tuple[dict[str, Any], list[tuple[str, str | None]]]:
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
        refs = {e.step: e.data["output"] for e in events if e.kind == "step_succeeded" and e.step}
        blobs = await journal.get_blobs(refs.values())
        return {sid: blobs[ref] for sid, ref in refs.items()}, [(e.kind, e.step) for e in events]


@pytest.mark.slow
def test_a_kill_during_a_speculative_attempt_resumes_to_the_outputs_without_speculation(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    log, gate = tmp_path / "effects.log", tmp_path / "gate"
    spec_plan, plain_plan = tmp_path / "spec.yaml", tmp_path / "plain.yaml"
    spec_plan.write_text(yaml.safe_dump(plan(log, gate, "safe")), encoding="utf-8")
    plain_plan.write_text(yaml.safe_dump(plan(tmp_path / "plain.log", gate, "off")), encoding="utf-8")
    try:
        kill_while_speculating(tmp_path, url, spec_plan)
    finally:
        gate.touch()

    _outputs, killed = asyncio.run(outputs_and_kinds(url, "crash"))
    assert ("speculation_started", "b") in killed
    assert [k for k in killed if k[0] in ("speculation_adopted", "speculation_discarded", "step_succeeded")] == []

    resumed = planweave(tmp_path, "resume", "crash", "--journal", url, *TOOLS)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    plain = planweave(tmp_path, "run", str(plain_plan), "--journal", url, "--run-id", "plain", *TOOLS)
    assert plain.returncode == 0, plain.stdout + plain.stderr

    outputs, kinds = asyncio.run(outputs_and_kinds(url, "crash"))
    plain_outputs, _ = asyncio.run(outputs_and_kinds(url, "plain"))
    assert outputs == plain_outputs == {"a": {"step": "a", "value": 1}, "b": {"step": "b", "value": 1},
                                        "c": {"step": "c", "value": 1}}
    assert [k for k in kinds if k[0] == "step_succeeded"] == [("step_succeeded", s) for s in ("a", "b", "c")]
    shown = planweave(tmp_path, "show", "crash", "--journal", url, "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["status"] == "succeeded"
    # The killed process's attempt of b is on the timeline as interrupted, never as a result.
    assert report["speculation"]["interrupted"] == 1
    assert log.read_text().split().count("b") >= 2  # its speculative call ran in both processes (or once as real)


def test_the_speculate_flag_overrides_the_plans_mode(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    gate = tmp_path / "gate"
    gate.touch()
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan(tmp_path / "effects.log", gate, "off", seconds=0.5)), encoding="utf-8")
    on = planweave(tmp_path, "run", str(plan_file), "--journal", url, "--run-id", "on", "--config", "speculate=safe",
                   "--json", *TOOLS)
    assert on.returncode == 0, on.stdout + on.stderr
    assert json.loads(on.stdout)["speculation"]["adopted"] == 1  # b, on a's predicted output
    bad = planweave(tmp_path, "run", str(plan_file), "--journal", url, "--config", "speculate=always", *TOOLS)
    assert bad.returncode == 2
    assert "always" in bad.stderr
