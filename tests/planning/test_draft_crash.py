"""A ``--goal`` run SIGKILLed while a verified draft attempt is in flight resumes to the plain planner's outputs.

The planner (``main``: 1 s to its first token, 30 tokens/s) and the draft model (``draft``: 0.1 s, 300 tokens/s) are
served by one scripted server in a thread of the test; ``planweave run --goal --draft-model draft`` runs in a child
process. Every call of the ``echo`` tool appends its step to a side-effect file, then waits at a gate (a file,
created only after the kill), so the moment of the kill is fixed, not raced: the plan is written, step ``a`` is
running on its draft attempt, which waits at the gate. The resumed run (no draft) must end with the outputs and
answer of a run without any draft, and the killed attempt stays on the timeline as interrupted, never a result.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from planweave import Toolbox
from planweave.journal import open_journal
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.crashy_tools import append_then_wait
from tests.cli.kill import env_with_root, sigkill_when
from tests.cli.test_cli import cli_command, journal_view, sqlite_url
from tests.threaded_llm import ThreadedLLM


async def echo(step: str, log: str, value: Any = None, gate: str | None = None) -> dict[str, Any]:
    """Append ``step`` to ``log``, wait for the file ``gate`` (if given), return ``{step, value}``."""
    await append_then_wait(log, step, gate)
    return {"step": step, "value": value}


toolbox = Toolbox()
toolbox.add(echo, idempotent=True)
TOOLS = ("--tools", "tests.planning.test_draft_crash:toolbox")


def plan(log: Path, gate: Path) -> list[dict[str, Any]]:
    return [{"id": "a", "tool": "echo", "args": {"step": "a", "value": 1, "log": str(log), "gate": str(gate)}},
            {"id": "b", "tool": "echo", "args": {"step": "b", "value": "${a.value}", "log": str(log)}}]


def served_models(steps: list[dict[str, Any]]) -> ThreadedLLM:
    """The draft model and the planner, both writing ``steps``; the planner's join answers ``done``."""

    def reply(req: RecordedRequest) -> Reply:
        if req.body.get("model") == "draft":
            return Text(plan_lines(steps), ttft=0.1, tokens_per_second=300)
        if "If the results answer the goal" in " ".join(str(m.get("content", "")) for m in req.messages):
            return Text(json.dumps({"answer": "done"}))
        return Text(plan_lines(steps), ttft=1.0, tokens_per_second=30)

    return ThreadedLLM(ScriptedLLM(reply, models=("main", "draft")))


def env() -> dict[str, str]:
    return env_with_root(OPENAI_API_KEY="sk-test")


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "gate"
    try:
        yield path
    finally:
        path.touch()  # never leave a child waiting


def outputs_of(url: str, run_id: str) -> tuple[dict[str, Any], str | None, list[dict[str, Any]]]:
    async def read() -> dict[str, Any]:
        async with open_journal(url) as journal:
            events = await journal.read(run_id)
            refs = {e.step: e.data["output"] for e in events if e.kind == "step_succeeded" and e.step}
            blobs = await journal.get_blobs(refs.values())
            return {sid: blobs[ref] for sid, ref in refs.items()}

    seen = journal_view(url, run_id)
    assert seen is not None and seen.state is not None
    return asyncio.run(read()), seen.state.answer, seen.state.speculations


@pytest.mark.slow
def test_a_goal_run_killed_mid_draft_resumes_to_the_plain_planners_outputs(tmp_path: Path, gate: Path) -> None:
    url, log = sqlite_url(tmp_path), tmp_path / "effects.log"
    with served_models(plan(log, gate)) as models:
        goal = ("goal", "echo twice", "--model", "main", "--base-url", models.url, "--journal", url, *TOOLS)
        sigkill_when(cli_command(*goal, "--config", "draft_model=draft", "--run-id", "crash", "--json"),
                     cwd=tmp_path, env=env(), url=url, run_id="crash",
                     ready=lambda state: any(v.get("model_finished_at") for v in state.versions) and any(
                         e["step"] == "a" and e["outcome"] == "running" for e in state.speculations),
                     never="the plan was never written with a's draft attempt running")
        gate.touch()
        resumed = subprocess.run(cli_command("resume", "crash", "--model", "main", "--base-url", models.url,
                                             "--journal", url, *TOOLS),
                                 cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=90)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        plain = subprocess.run(cli_command(*goal, "--run-id", "plain"), cwd=tmp_path, env=env(),
                               capture_output=True, text=True, timeout=90)
        assert plain.returncode == 0, plain.stdout + plain.stderr
    outputs, answer, speculations = outputs_of(url, "crash")
    plain_outputs, plain_answer, _ = outputs_of(url, "plain")
    assert outputs == plain_outputs == {"a": {"step": "a", "value": 1}, "b": {"step": "b", "value": 1}}
    assert answer == plain_answer == "done"
    assert [(e["step"], e["outcome"]) for e in speculations] == [("a", "interrupted")]
    assert log.read_text().split().count("a") >= 2  # the killed draft attempt's call, then a's real one
