"""Secrets stay out of everything ``planweave submit`` and ``planweave worker`` write or print, as for ``run``.

A plan reads a secret from the environment (``printenv``) and carries it as a literal argument (``Bearer ...``) to a
step that fails saying it. It goes through real ``submit`` and ``worker`` processes on PostgreSQL, the secret
planted in their environment; afterwards every table of the journal's schema (every column, bytes as hex too), the
workers' stdout and stderr and what ``workers --json``, ``runs --json`` and ``show --json`` print (run without the
secret in their environment, so nothing can be hidden at display) must not hold it. Also when the worker running the
plan is SIGKILLed mid-run and another takes it over.

And a journal URL's password: ``run``, ``submit`` and ``workers --json`` never print it.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from planweave.core.errors import RunError
from planweave.journal.leases import QueuedRun
from planweave.tools.safety import SecretRedactor
from tests.workers.conftest import Schema
from tests.workers.procs import REPO, TOOLS, WorkerProcess, done, start_worker, started_by, wait_until
from tests.workers.test_server_queue import queue_server

pytestmark = [pytest.mark.postgres]

LEASE = ("--lease", "2", "--renew-every", "0.4")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def environment(secret: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLANWEAVE_JOURNAL", "OPENAI_API_KEY")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if secret is not None:
        env["OPENAI_API_KEY"] = secret
    return env


def leaky_plan(tmp: Path, secret: str, gate: Path | None = None) -> Path:
    """``env`` prints the key; ``call`` gets it as a literal argument and fails saying it (so the run fails)."""
    steps: list[dict[str, Any]] = []
    if gate is not None:
        steps.append({"id": "hold", "tool": "wait_for", "args": {"gate": str(gate)}})
    steps.append({"id": "env", "tool": "shell", "args": {"argv": ["printenv", "OPENAI_API_KEY"]},
                  "after": [s["id"] for s in steps]})
    steps.append({"id": "call", "tool": "shell", "after": ["env"], "args": {
        "argv": ["sh", "-c", 'echo "bad key $1" >&2; exit 3', "sh", f"Bearer {secret}"]}})
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump({"name": f"uses {secret}", "steps": steps}))
    return path


def found_in_database(pg: Schema, secret: str) -> list[str]:
    """Every row of every table of the journal's schema, as JSON (bytea columns as hex), that holds ``secret``."""
    hexed = secret.encode().hex()
    tables = [t for (t,) in pg.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg.name,))]
    assert {"planweave_events", "planweave_blobs", "planweave_runs", "planweave_leases"} <= set(tables), tables
    hits = []
    for table in tables:
        for (row,) in pg.query(f"SELECT row_to_json(t)::text FROM {{s}}.{table} t"):
            if secret in row or hexed in row:
                hits.append(f"{table}: {row[:300]}")
    return hits


def shown(pg: Schema, run_id: str) -> str:
    """What the listing commands print, run without the secret in their environment."""
    bare = environment(None)
    out = []
    for args in (("workers", "--all"), ("runs",), ("show", run_id)):
        listed = cli(*args, "--journal", pg.url, "--json", env=bare)
        assert listed.returncode == 0 or args[0] == "show", listed
        out += [listed.stdout, listed.stderr]
    return "\n".join(out)


def stopped(worker: WorkerProcess, tmp: Path) -> str:
    assert worker.stop() == 0, worker.text()
    return worker.text() + (tmp / f"{worker.name}.out").read_text(errors="replace")


def test_a_run_through_submit_and_worker_stores_and_prints_no_secret(pg_schema: Schema, tmp_path: Path) -> None:
    secret = f"sk-test-{secrets.token_hex(12)}"
    env = environment(secret)
    queued = cli("submit", str(leaky_plan(tmp_path, secret)), "--journal", pg_schema.url, "--tools", TOOLS,
                 "--run-id", "leaky", "--json", env=env)
    assert queued.returncode == 0, queued
    worker = start_worker(pg_schema.url, "w1", tmp_path, *LEASE, env=env)
    try:
        wait_until("the run done", lambda: done(pg_schema) == 1)
    finally:
        printed = stopped(worker, tmp_path)
    ((outcome, error),) = pg_schema.query("SELECT outcome, error FROM {s}.planweave_leases")
    assert outcome == "failed" and "bad key" in error, (outcome, error)  # the failure is still told, redacted
    assert "***" in error, error

    assert found_in_database(pg_schema, secret) == []
    assert secret not in queued.stdout + queued.stderr
    assert secret not in printed, printed
    assert secret not in shown(pg_schema, "leaky")


@pytest.mark.slow
def test_a_run_taken_over_from_a_killed_worker_stores_and_prints_no_secret(pg_schema: Schema, tmp_path: Path) -> None:
    secret = f"sk-test-{secrets.token_hex(12)}"
    env = environment(secret)
    gate = tmp_path / "gate"
    queued = cli("submit", str(leaky_plan(tmp_path, secret, gate)), "--journal", pg_schema.url, "--tools", TOOLS,
                 "--run-id", "leaky", env=env)
    assert queued.returncode == 0, queued
    first = start_worker(pg_schema.url, "w1", tmp_path, *LEASE, env=env)
    try:
        wait_until("w1 running the run", lambda: started_by(pg_schema, "w1") == 1)
    finally:
        first.kill()
    second = start_worker(pg_schema.url, "w2", tmp_path, *LEASE, env=env)
    try:
        wait_until("w2 holding the run", lambda: bool(pg_schema.query(
            "SELECT 1 FROM {s}.planweave_leases WHERE holder = 'w2'")))
        gate.touch()
        wait_until("the run done", lambda: done(pg_schema) == 1)
    finally:
        printed = stopped(second, tmp_path)
    taken = pg_schema.query("SELECT holder, previous FROM {s}.planweave_lease_claims ORDER BY epoch")
    assert taken == [("w1", None), ("w2", "w1")], taken
    ((outcome, error),) = pg_schema.query("SELECT outcome, error FROM {s}.planweave_leases")
    assert outcome == "failed" and "bad key Bearer ***" in error, (outcome, error)

    assert found_in_database(pg_schema, secret) == []
    assert secret not in queued.stdout + queued.stderr
    assert secret not in printed + first.text() + (tmp_path / "w1.out").read_text(), printed
    assert secret not in shown(pg_schema, "leaky")


def test_a_queued_plan_is_sealed_and_only_a_worker_with_the_variable_puts_the_secret_back() -> None:
    secret = f"sk-test-{secrets.token_hex(12)}"
    plan = {"steps": [{"id": "a", "tool": "shell", "args": {"argv": ["curl", "-H", f"Bearer {secret}"]}}]}
    queued = QueuedRun("r1", plan, "plan.yaml", {"priority": 2})
    sealed = queued.sealed(SecretRedactor({"OPENAI_API_KEY": secret}))
    assert secret not in json.dumps([sealed.plan, sealed.options]) and "$OPENAI_API_KEY" in json.dumps(sealed.plan)
    assert sealed.options["priority"] == 2
    assert queued.sealed(SecretRedactor({})) is queued and queued.sealed(None) is queued  # nothing to seal

    assert sealed.unsealed_plan(SecretRedactor({"OPENAI_API_KEY": secret})) == plan
    with pytest.raises(RunError, match="set OPENAI_API_KEY in this environment"):
        sealed.unsealed_plan(SecretRedactor({"OTHER_TOKEN": "abcdefgh"}))
    with pytest.raises(RunError, match="no seal"):
        sealed.unsealed_plan(None)
    assert queued.unsealed_plan(None) == plan


@pytest.mark.slow
async def test_a_plan_queued_over_http_is_kept_sealed_and_run_with_its_secret(
        pg_schema: Schema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"sk-test-{secrets.token_hex(12)}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)  # the server's environment
    plan = yaml.safe_load(leaky_plan(tmp_path, secret).read_text())
    plan["steps"][1]["args"]["argv"][2] = 'test "$1" = "Bearer $OPENAI_API_KEY"'  # succeeds if it got the value
    async with queue_server(pg_schema.url) as client:
        posted = await client.post("/runs", json={"plan": plan, "run_id": "via-http"})
        assert posted.status_code == 201, posted.text
    assert found_in_database(pg_schema, secret) == []
    worker = start_worker(pg_schema.url, "w1", tmp_path, *LEASE, env=environment(secret))
    try:
        await asyncio.to_thread(wait_until, "the run done", lambda: done(pg_schema) == 1)
    finally:
        printed = stopped(worker, tmp_path)
    assert pg_schema.query("SELECT outcome, error FROM {s}.planweave_leases") == [("succeeded", None)], printed
    assert found_in_database(pg_schema, secret) == []
    assert secret not in printed


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or getpass.getuser()
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port or 5432}"))


def test_run_submit_and_workers_never_print_the_journal_password(pg_schema: Schema, tmp_path: Path) -> None:
    password = f"pw{secrets.token_hex(8)}"
    url = with_password(pg_schema.url, password)
    env = environment(None)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [{"id": "a", "tool": "pause", "args": {"seconds": 0.01}}]}))

    ran = cli("run", str(plan), "--journal", url, "--tools", TOOLS, "--json", env=env)
    assert ran.returncode == 0, ran
    assert "resume with: planweave resume" in ran.stderr and ":***@" in ran.stderr, ran.stderr
    queued = cli("submit", str(plan), "--journal", url, "--tools", TOOLS, "--json", env=env)
    assert queued.returncode == 0, queued
    assert json.loads(queued.stdout)["journal"] == with_password(pg_schema.url, "***")
    human = cli("submit", str(plan), "--journal", url, "--tools", TOOLS, env=env)
    assert human.returncode == 0 and ":***@" in human.stderr, human
    listed = cli("workers", "--journal", url, "--json", env=env)
    assert listed.returncode == 0, listed
    assert json.loads(listed.stdout)["journal"] == with_password(pg_schema.url, "***")

    for done_ in (ran, queued, human, listed):
        assert password not in done_.stdout + done_.stderr, done_
