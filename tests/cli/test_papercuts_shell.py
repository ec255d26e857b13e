"""Issue 27, part 5: a failed shell step keeps what its program printed, stdout and stderr, in its error, so
``show RUN --step X`` shows them; the run's error and the tables keep to its first line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, write_plan

PLAN = {
    "name": "build",
    "steps": [
        {"id": "build", "tool": "shell",
         "args": {"argv": ["sh", "-c", "echo compiling; echo 'test_total FAILED at line 42'; echo boom >&2; exit 3"]}},
    ],
}


def test_a_failed_shell_step_keeps_its_stdout_and_stderr_for_show(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    env = subprocess_env()
    ran = subprocess.run(cli_command("run", str(write_plan(tmp_path / "build.yaml", PLAN)), "--journal", url,
                                     "--run-id", "b"), env=env, capture_output=True, text=True, timeout=60)
    shown = subprocess.run(cli_command("show", "b", "--step", "build", "--journal", url), env=env,
                           capture_output=True, text=True, timeout=60)
    detail = json.loads(subprocess.run(cli_command("show", "b", "--step", "build", "--journal", url, "--json"),
                                       env=env, capture_output=True, text=True, timeout=60).stdout)

    assert ran.returncode == 1
    assert "error: step 'build' failed: sh exited with code 3: boom\n" in ran.stdout  # the run's error: one line
    assert "test_total FAILED" not in ran.stdout
    assert shown.returncode == 0
    for printed in ("compiling", "test_total FAILED at line 42", "boom"):
        assert printed in shown.stdout, shown.stdout
        assert printed in detail["error"]
    assert detail["error"].startswith("sh exited with code 3: boom\nstdout:\ncompiling\n")
