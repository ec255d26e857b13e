"""The first reply is final, between real processes on a shared SQLite or PostgreSQL journal.

With the run's process dead, ``planweave approve --reject`` then ``planweave approve`` exits non-zero naming the
rejection, and the resumed run never starts the step. With the run's process alive, two ``planweave send`` started
at once for the same step: exactly one is accepted, the other exits non-zero naming the accepted value, and that
value is the step's output.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from planweave import open_journal
from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, wait_for_step
from tests.processes import running
from tests.workers.conftest import pg_schema  # noqa: F401  (a fixture: a fresh PostgreSQL schema)

GATED = {"steps": [
    {"id": "build", "tool": "sleep", "args": {"seconds": 0.05, "result": {"artifact": "v1"}}},
    {"id": "deploy", "tool": "noop", "args": {"what": "${build.artifact}"}, "approval": "Deploy v1?",
     "after": ["build"]},
]}
ROUNDS = 3
ASKING = {"steps": [
    *({"id": f"ask{i}", "tool": "human.input", "args": {"prompt": "Replicas?", "schema": {"type": "integer"}}}
      for i in range(ROUNDS)),
    {"id": "report", "tool": "noop", "args": {f"ask{i}": f"${{ask{i}}}" for i in range(ROUNDS)}},
]}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("pg_schema").url)


def planweave(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=subprocess_env(), capture_output=True, text=True, timeout=120)


def events_of(url: str, run_id: str) -> list[tuple[str, str | None, dict[str, object]]]:
    import asyncio

    async def read() -> list[tuple[str, str | None, dict[str, object]]]:
        async with open_journal(url) as journal:
            return [(e.kind, e.step, dict(e.data)) for e in await journal.read(run_id)]

    return asyncio.run(read())


def test_with_the_owner_dead_a_rejection_stands_and_the_resumed_run_never_deploys(tmp_path: Path, url: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(GATED))
    with running(cli_command("run", str(plan), "--journal", url, "--run-id", "r1", "--json"),
                 env=subprocess_env()) as owner:
        wait_for_step(url, "r1", "deploy", "waiting_approval", owner)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    rejected = planweave("approve", "r1", "deploy", "--reject", "--reason", "freeze week", "--journal", url)
    approved = planweave("approve", "r1", "deploy", "--journal", url)
    resumed = planweave("resume", "r1", "--journal", url, "--json")
    assert rejected.returncode == 0, rejected.stderr
    assert "recorded and applies when the run resumes" in rejected.stdout
    assert approved.returncode != 0, approved.stdout
    assert "already has a reply, and the first reply is final: rejected ('freeze week') by " in approved.stderr
    assert "approved step" not in approved.stdout
    summary = json.loads(resumed.stdout)
    assert summary["status"] == "failed", resumed.stderr
    events = events_of(url, "r1")
    assert ("step_started", "deploy") not in [(kind, step) for kind, step, _ in events]
    assert [data["approve"] for kind, _, data in events if kind == "approval_given"] == [False]
    assert [data["approve"] for kind, _, data in events if kind == "step_reply"] == [False]  # the later one: never


def test_with_the_owner_alive_of_two_sends_at_once_exactly_one_is_accepted_and_the_step_gets_it(
    tmp_path: Path, url: str,
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(ASKING))
    accepted: dict[str, int] = {}
    with running(cli_command("run", str(plan), "--journal", url, "--run-id", "r1", "--json"),
                 env=subprocess_env()) as owner:
        for i in range(ROUNDS):
            wait_for_step(url, "r1", f"ask{i}", "waiting_input", owner)
        for i in range(ROUNDS):
            values = (10 * i + 1, 10 * i + 2)
            sends = [subprocess.Popen(cli_command("send", "r1", f"ask{i}", "--value", str(v), "--journal", url),
                                      env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for v in values]
            done = [(value, proc.returncode, out, err)
                    for value, proc in zip(values, sends, strict=True)
                    for out, err in [proc.communicate(timeout=120)]]
            winners = [d for d in done if d[1] == 0]
            losers = [d for d in done if d[1] != 0]
            assert len(winners) == 1 and len(losers) == 1, done
            accepted[f"ask{i}"] = winners[0][0]
            assert "the process running it applies it (confirmed" in winners[0][2], winners
            refused = losers[0][3]
            # The later send is told which reply won; after the last round's winner the run may already have ended
            # on it before the later send read the journal, and then that is what it is told (also a refusal).
            last = i == ROUNDS - 1
            assert (f"first reply is final: the value {winners[0][0]} by " in refused
                    or (last and "run 'r1' already ended: succeeded" in refused)), losers
        out, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "succeeded"
    assert {step: summary["outputs"][step] for step in accepted} == accepted
    given = {step: data["value"] for kind, step, data in events_of(url, "r1") if kind == "input_given" and step}
    assert given == accepted
