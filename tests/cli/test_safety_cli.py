"""Safe by default from the CLI: the shell jail and allowlist, confined file tools, secrets kept out of the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
                       "  - {id: x, tool: file.read, args: {path: ../../etc/passwd}}\n")
    done = planweave("run", p, "--root", "data", "--journal", "memory://", "--json", cwd=tmp_path)
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
    raw = b"".join(f.read_bytes() for f in tmp_path.glob("runs.db*"))
    assert SECRET.encode() not in raw and b"key=***" in raw
