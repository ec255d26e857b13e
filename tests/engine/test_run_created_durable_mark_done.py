"""A person settles a step whose outcome is unknown after a crash: ``planweave resume RUN --done STEP[=OUTPUT]``.

The non-idempotent step ``charge`` writes its effect and its process is SIGKILLed before the step can return. A resume
alone stops short of it (its outcome is unknown) and ``--retry-unknown`` would repeat the effect; ``--done`` records
the person's word (who, when) as the step's success with the given output, and the run goes on from it without calling
the tool again.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from planweave import Toolbox
from planweave.core.events import Event
from planweave.journal import open_journal
from tests.cli.kill import env_with_root
from tests.cli.test_cli import cli_command, sqlite_url
from tests.engine.test_run_created_durable import effect_then_die


async def echo(value: Any) -> Any:
    """Return ``value``."""
    return value


toolbox = Toolbox()
toolbox.add(effect_then_die, name="charge")  # not idempotent: its outcome is unknown after the kill
toolbox.add(echo, idempotent=True)
TOOLS = ("--tools", "tests.engine.test_run_created_durable_mark_done:toolbox")


def planweave(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), cwd=cwd, env=env_with_root(), capture_output=True, text=True, timeout=90)


def killed_run(tmp_path: Path) -> tuple[str, Path]:
    """Run id ``crash`` in a new SQLite journal, killed right after ``charge`` had its effect."""
    url, log = sqlite_url(tmp_path), tmp_path / "effects.log"
    plan = {"name": "charge-then-report", "steps": [
        {"id": "charge", "tool": "charge", "args": {"step": "charge", "log": str(log), "once": str(tmp_path / "k")}},
        {"id": "report", "tool": "echo", "args": {"value": "${charge.receipt}"}},
    ]}
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan), encoding="utf-8")
    killed = planweave(tmp_path, "run", str(plan_file), "--journal", url, "--run-id", "crash", *TOOLS)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    return url, log


def events(url: str) -> list[Event]:
    async def read() -> list[Event]:
        async with open_journal(url) as journal:
            return await journal.read("crash")

    return asyncio.run(read())


def test_a_step_marked_done_succeeds_with_the_given_output_and_the_run_goes_on(tmp_path: Path) -> None:
    url, log = killed_run(tmp_path)
    stopped = planweave(tmp_path, "resume", "crash", "--journal", url, *TOOLS)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "--done STEP" in stopped.stdout + stopped.stderr  # the way out is named

    resumed = planweave(tmp_path, "resume", "crash", "--journal", url, "--json", "--done", 'charge={"receipt": "r-7"}',
                        *TOOLS)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "succeeded"
    assert log.read_text().split() == ["charge"]  # its effect happened once: the tool was not called again
    journaled = events(url)
    done = [e for e in journaled if e.kind == "step_succeeded" and e.step == "charge"]
    assert len(done) == 1 and done[0].data["done"] is True and "@" in done[0].data["by"]
    report = next(e for e in journaled if e.kind == "step_succeeded" and e.step == "report")
    assert report.data["attempt"] == 1

    async def outputs() -> dict[str, Any]:
        async with open_journal(url) as journal:
            return await journal.get_blobs([report.data["output"]])

    assert asyncio.run(outputs()) == {report.data["output"]: "r-7"}  # report read the output the person gave


def test_done_right_after_the_kill_needs_no_resume_first_and_refuses_other_steps(tmp_path: Path) -> None:
    url, log = killed_run(tmp_path)
    wrong = planweave(tmp_path, "resume", "crash", "--journal", url, "--done", "report", *TOOLS)
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert "step 'report'" in wrong.stderr and "pending" in wrong.stderr
    bad = planweave(tmp_path, "resume", "crash", "--journal", url, "--done", "charge={oops", *TOOLS)
    assert bad.returncode == 2 and "--done charge={oops" in bad.stderr, bad.stderr

    resumed = planweave(tmp_path, "resume", "crash", "--journal", url, "--done", "charge", *TOOLS)  # output: null
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "charge has no key 'receipt' (a NoneType)" in resumed.stdout  # report ran, on the null given
    assert log.read_text().split() == ["charge"]
    assert [e.data.get("done") for e in events(url) if e.kind == "step_succeeded"] == [True]


def test_a_secret_a_person_gives_with_done_is_journaled_hidden(tmp_path: Path) -> None:
    """The output given with ``--done`` goes through the engine's redaction as a tool's output does."""
    secret = "sk-planted-7f3a9c2e1b"
    url, _ = killed_run(tmp_path)
    env = env_with_root(DEMO_API_KEY=secret)
    given = "charge=" + json.dumps({"receipt": secret})
    resumed = subprocess.run(cli_command("resume", "crash", "--journal", url, "--json", "--done", given, *TOOLS),
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert secret not in resumed.stdout
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix not in (".log", ".yaml")]
    assert stored  # neither the output given nor what read it
    assert not [p.name for p in stored if secret.encode() in p.read_bytes()]
