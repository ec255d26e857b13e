"""Issue 27, part 5: off a terminal (a CI log, a pipe) the tables of ``run``, ``show`` and ``runs`` are not wrapped
at 80 columns: a row stays one line; $COLUMNS, when set, is the width."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.test_cli import cli_command, sqlite_url, subprocess_env, write_plan

REASON = "the upstream service answered 503 Service Unavailable for every one of the three mirrors it was given"
PLAN = {
    "name": "mirrors-of-the-upstream-release-artifacts",
    "steps": [
        {"id": "fetch_the_release_artifacts", "tool": "shell",
         "args": {"argv": ["sh", "-c", f"echo '{REASON}' >&2; exit 1"]}},
        {"id": "unpack", "tool": "noop", "after": ["fetch_the_release_artifacts"]},
    ],
}


def _outputs(tmp_path: Path, columns: str | None) -> list[str]:
    url = sqlite_url(tmp_path)
    env = {k: v for k, v in subprocess_env().items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    plan = write_plan(tmp_path / "plan.yaml", PLAN)
    outs = []
    for args in (("run", str(plan), "--run-id", "w"), ("show", "w"), ("runs",)):
        done = subprocess.run(cli_command(*args, "--journal", url), env=env, capture_output=True, text=True,
                              timeout=60)
        outs.append(done.stdout)
    return outs


def test_off_a_terminal_a_row_stays_one_line(tmp_path: Path) -> None:
    ran, shown, listed = _outputs(tmp_path, None)

    for out in (ran, shown):
        row = next(line for line in out.splitlines() if line.startswith("fetch_the_release_artifacts "))
        assert REASON in row and "failed" in row, out
    row = next(line for line in listed.splitlines() if line.startswith("w "))
    assert str(PLAN["name"]) in row and "1 failed" in row and "1 skipped" in row, listed


def test_off_a_terminal_columns_is_the_width_when_set(tmp_path: Path) -> None:
    ran, shown, _listed = _outputs(tmp_path, "80")

    for out in (ran, shown):
        row = next(line for line in out.splitlines() if line.startswith("fetch_the_release_artifacts "))
        assert len(row) <= 80 and REASON not in row, out  # the error folded to fit
