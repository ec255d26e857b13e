"""Issue 27, part 5: an approval's question is shown with its references rendered (on the outputs there are when
its step becomes ready): in the live view, the journaled ``approval_requested`` event, ``show`` and ``show --json``
(the object ``GET /runs/{id}`` serves too)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from planweave import open_journal
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step, write_plan
from tests.processes import read_until, running

PLAN = {
    "name": "deploy",
    "steps": [
        {"id": "compare", "tool": "noop", "args": {"warmest": "Rome", "temps": {"rome": 24}}},
        {"id": "deploy", "tool": "noop", "args": {"city": "${compare.warmest}"},
         "approval": "Deploy ${compare.warmest} at ${compare.temps}? (${compare.nothing} stays, $${literal})"},
    ],
}
RENDERED = 'Deploy Rome at {"rome":24}? (${compare.nothing} stays, ${literal})'


def _journaled_prompt(url: str, run_id: str) -> str | None:
    async def read() -> str | None:
        async with open_journal(url) as journal:
            events = await journal.read(run_id, kind="approval_requested")
        return events[-1].data.get("prompt")

    return asyncio.run(read())


def test_an_approval_question_is_shown_and_journaled_with_its_references_rendered(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "deploy.yaml", PLAN)
    url = sqlite_url(tmp_path)
    env = subprocess_env()
    with running(cli_command("run", str(plan), "--journal", url, "--run-id", "ask"), env=env, cwd=tmp_path) as proc:
        asked = read_until(proc, "waiting for approval: deploy")[-1]
        wait_for_step(url, "ask", "deploy", "waiting_approval", proc)
        shown = subprocess.run(cli_command("show", "ask", "--journal", url), env=env, capture_output=True, text=True,
                               timeout=60)
        as_json = subprocess.run(cli_command("show", "ask", "--journal", url, "--json"), env=env,
                                 capture_output=True, text=True, timeout=60)

    assert RENDERED in asked, asked
    assert _journaled_prompt(url, "ask") == RENDERED
    assert shown.returncode == 0 and RENDERED in shown.stdout, shown.stdout
    assert "planweave approve ask deploy" in shown.stdout  # and what answers it
    assert json.loads(as_json.stdout)["steps"]["deploy"]["prompt"] == RENDERED
