"""Safe by default from the CLI: the shell jail and allowlist, confined file tools, secrets kept out of the journal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import journal_bytes

SECRET = "sk-test-9f8e7d6c5b4a"


def planweave(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})}, check=False)


def plan(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(body)
    return str(path)


def test_programs_off_the_allowlist_are_refused_before_anything_runs(tmp_path: Path) -> None:
    p = plan(tmp_path, "steps:\n  - {id: a, tool: shell, args: {argv: [echo, hi]}}\n"
                       "  - {id: b, tool: shell, args: {argv: [rm, -rf, x]}}\n")
    done = planweave("run", p, "--allow-exec", "echo", "--journal", "memory://", cwd=tmp_path)
    assert done.returncode == 2
    assert "step 'b', args.argv[0]: program 'rm' is not on this run's executable allowlist (echo)" in done.stderr
    assert planweave("run", p, "--allow-exec", "echo", "--allow-exec", "rm", "--journal", "memory://",
                     cwd=tmp_path).returncode == 0


def test_shell_cwd_is_jailed_to_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "inside").mkdir()
    p = plan(tmp_path, "steps:\n  - {id: a, tool: shell, args: {argv: [pwd], cwd: /}}\n")
    done = planweave("run", p, "--journal", "memory://", cwd=tmp_path)
    assert done.returncode == 2 and "path '/' is outside the allowed roots" in done.stderr
    p = plan(tmp_path, "steps:\n  - {id: a, tool: shell, args: {argv: [pwd], cwd: inside}}\n")
    done = planweave("run", p, "--journal", "memory://", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    p = plan(tmp_path, "steps:\n  - {id: a, tool: noop, args: {d: '..'}}\n"
                       "  - {id: b, tool: shell, args: {argv: [pwd], cwd: '${a.d}'}}\n")
    done = planweave("run", p, "--journal", "memory://", "--json", cwd=tmp_path / "inside")
    report = json.loads(done.stdout)
    assert report["steps"]["b"]["status"] == "failed" and "climbs out of" in report["steps"]["b"]["error"]


def test_file_tools_stay_inside_their_roots(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    p = plan(tmp_path, "steps:\n  - {id: w, tool: file.write, args: {path: notes.txt, text: hello}}\n"
                       "  - {id: r, tool: file.read, args: {path: notes.txt}, after: [w]}\n"
                       "  - {id: x, tool: file.read, args: {path: ../../etc/passwd}, after: [r]}\n")
    done = planweave("run", p, "--config", 'roots=["data"]', "--journal", "memory://", "--json", cwd=tmp_path)
    report = json.loads(done.stdout)
    assert report["steps"]["r"]["status"] == "succeeded"
    assert (tmp_path / "data" / "notes.txt").read_text() == "hello"
    assert report["steps"]["x"]["status"] == "failed" and "climbs out of" in report["steps"]["x"]["error"]


def test_secret_values_never_reach_the_journal_or_show(tmp_path: Path) -> None:
    p = plan(tmp_path, "steps:\n"
                       "  - {id: leak, tool: shell, args: {argv: [sh, -c, 'echo key=$OPENAI_API_KEY']}}\n"
                       "  - {id: fail, tool: shell, args: {argv: [sh, -c, 'echo bad $OPENAI_API_KEY >&2; exit 3']}}\n")
    db = tmp_path / "runs.db"
    done = planweave("run", p, "--journal", f"sqlite:///{db}", "--json", cwd=tmp_path,
                     env={"OPENAI_API_KEY": SECRET})
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert SECRET not in done.stdout + done.stderr
    assert "bad ***" in report["steps"]["fail"]["error"]
    shown = planweave("show", report["run_id"], "--journal", f"sqlite:///{db}", "--json", cwd=tmp_path)
    assert SECRET not in shown.stdout
    raw = journal_bytes(tmp_path)
    assert SECRET.encode() not in raw and b"key=***" in raw


# -- the allowlist holds: one resolution, checked and executed; env and options that run other programs ----------
def fake_program(directory: Path, name: str, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(f"#!/bin/sh\necho ran > '{marker}'\n")
    (directory / name).chmod(0o755)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_path_in_a_steps_env_cannot_swap_the_allowed_git(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    fake_program(tmp_path / "evil", "git", marker)
    p = plan(tmp_path, "steps:\n  - {id: v, tool: shell, args: {argv: [git, --version], env: {PATH: evil}}}\n")
    done = planweave("run", p, "--allow-exec", "git", "--journal", "memory://", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert ("step 'v', args.env.PATH: env key 'PATH' refused: it changes which program a name runs "
            '(rule PATH; allow it with allow_env = ["PATH"] in a --config)') in done.stderr
    done = planweave("run", p, "--allow-exec", "git", "--config", 'allow_env=["PATH"]', "--journal", "memory://",
                     "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()  # the git of planweave's own PATH ran
    assert planweave("run", p, "--config", 'allow_env=["PATH"]', "--journal", "memory://",
                     cwd=tmp_path).returncode == 2


def test_a_relative_program_is_checked_where_it_runs(tmp_path: Path) -> None:
    legit, planted = tmp_path / "legit", tmp_path / "planted"
    fake_program(tmp_path / "bin", "build", legit)
    fake_program(tmp_path / "jail" / "sub" / "bin", "build", planted)
    p = plan(tmp_path, "steps:\n  - {id: b, tool: shell, args: {argv: [bin/build], cwd: sub}}\n")
    done = planweave("run", p, "--workdir", "jail", "--allow-exec", str(tmp_path / "bin" / "build"),
                     "--journal", "memory://", cwd=tmp_path)
    assert done.returncode == 2
    assert f"program 'bin/build' (resolved to {tmp_path}/jail/sub/bin/build) is not on" in done.stderr
    assert not planted.exists() and not legit.exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_cannot_be_told_to_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = plan(tmp_path, "steps:\n"
                       f"  - {{id: a, tool: shell, args: {{argv: [git, -c, 'alias.x=!touch {marker}', x]}}}}\n"
                       "  - {id: e, tool: shell, args: {argv: [git, x], env: {GIT_CONFIG_COUNT: '1',\n"
                       f"      GIT_CONFIG_KEY_0: alias.x, GIT_CONFIG_VALUE_0: '!touch {marker}'}}}}}}\n")
    done = planweave("run", p, "--allow-exec", "git", "--journal", "memory://", cwd=tmp_path)
    assert done.returncode == 2
    assert "step 'a', args.argv[1]: option '-c' is refused for git: it runs other programs" in done.stderr
    assert "step 'e', args.env.GIT_CONFIG_COUNT: env key 'GIT_CONFIG_COUNT' refused" in done.stderr
    assert not marker.exists()


def test_a_program_known_only_at_call_time_is_refused_naming_the_step(tmp_path: Path) -> None:
    p = plan(tmp_path, "steps:\n  - {id: a, tool: noop, args: {argv: [sh, -c, 'echo pwned']}}\n"
                       "  - {id: b, tool: shell, args: {argv: '${a.argv}'}}\n")
    done = planweave("run", p, "--allow-exec", "echo", "--journal", "memory://", "--json", cwd=tmp_path)
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert report["steps"]["b"]["error"] == (
        "step 'b': program 'sh' is not on this run's executable allowlist (echo)")


# -- a secret written literally in a plan: journaled and served as ***$NAME#NONCE***, run with the value ---------------
def hash_step(secret: str, extra: str = "") -> str:
    """A step that writes the sha256 of the value it was given to used.txt (so the value itself shows nowhere)."""
    return ("  - {id: use, tool: shell, args: {argv: [sh, -c, 'printf %s \"$1\" | sha256sum > used.txt', _, '"
            + secret + "']}" + extra + "}\n")


def used_hash(tmp_path: Path) -> str:
    return (tmp_path / "used.txt").read_text().split()[0]


def test_a_secret_in_a_plan_file_stays_out_of_the_journal_and_a_resume_needs_its_variable(tmp_path: Path) -> None:
    p = plan(tmp_path, "steps:\n  - {id: gate, tool: shell, args: {argv: [sh, -c, 'test -f open || sleep 60']},"
                       " idempotent: true}\n" + hash_step(SECRET, ", after: [gate]"))
    db = tmp_path / "runs.db"
    env = {"OPENAI_API_KEY": SECRET}
    proc = subprocess.Popen([sys.executable, "-m", "planweave.cli.main", "run", p, "--journal", f"sqlite:///{db}",
                             "--json"], cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while b"step_started" not in journal_bytes(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.kill()  # a crash while the gate waits
        proc.communicate()
    raw = journal_bytes(tmp_path)
    assert SECRET.encode() not in raw and b"***$OPENAI_API_KEY#" in raw
    run_id = json.loads(planweave("runs", "--journal", f"sqlite:///{db}", "--json", cwd=tmp_path).stdout)[0]["run_id"]
    (tmp_path / "open").write_text("")
    bare = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    refused = subprocess.run([sys.executable, "-m", "planweave.cli.main", "resume", run_id, "--journal",
                              f"sqlite:///{db}"], cwd=tmp_path, env=bare, capture_output=True, text=True,
                             timeout=120, check=False)
    assert refused.returncode != 0
    assert "its plan held the value of $OPENAI_API_KEY" in refused.stderr
    assert "set OPENAI_API_KEY in this environment to resume it" in refused.stderr
    done = planweave("resume", run_id, "--journal", f"sqlite:///{db}", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert used_hash(tmp_path) == hashlib.sha256(SECRET.encode()).hexdigest()  # the step got the real value
    shown = planweave("show", run_id, "--journal", f"sqlite:///{db}", "--json", cwd=tmp_path)
    raw = journal_bytes(tmp_path)
    assert SECRET not in done.stdout + shown.stdout and SECRET.encode() not in raw


def test_a_secret_in_a_posted_plan_is_not_stored_nor_served(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    token = "pw-test-token-0123456789"
    code = ("import asyncio; from planweave.server import serve; "
            f"asyncio.run(serve(port=0, journal='sqlite:///{db}'))")
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "PLANWEAVE_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" serving ")[1].split(" ")[0]
        steps = [{"id": "use", "tool": "shell", "args": {"argv": [
            "sh", "-c", 'printf %s "$1" | sha256sum > used.txt', "_", SECRET]}, "description": f"with {SECRET}"},
            {"id": "echo", "tool": "noop", "args": {"auth": f"Bearer {SECRET}"}},
            {"id": "wait", "tool": "sleep", "args": {"seconds": 1.5}, "description": f"holds {SECRET}"}]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            created = client.post("/runs", json={"plan": {"name": f"deploy {SECRET}", "steps": steps}})
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            live = [client.get(path).text for path in (f"/runs/{run_id}", f"/runs/{run_id}/plan", "/runs")]
            with client.stream("GET", f"/runs/{run_id}/events") as stream:
                sse = "\n".join(stream.iter_lines())  # ends after run_finished
            served = [client.get(path).text for path in
                      (f"/runs/{run_id}", f"/runs/{run_id}/plan", "/runs", f"/runs/{run_id}/steps/echo")]
    finally:
        proc.kill()
        proc.communicate()
    assert "run_finished" in sse and "***$OPENAI_API_KEY#" in sse
    assert '"status":"running"' in live[0].replace(" ", "")  # looked at while the run was going
    for text in (sse, *served, *live):
        assert SECRET not in text
    assert used_hash(tmp_path) == hashlib.sha256(SECRET.encode()).hexdigest()
    raw = journal_bytes(tmp_path)
    assert SECRET.encode() not in raw


