"""``planweave run --help`` groups its twenty options in panels, each option in the one it belongs to."""

from __future__ import annotations

import os
import re
import subprocess
import sys

PANELS = {
    "Journal and output": {"--config", "--journal", "--run-id", "--json", "--virtual-clock", "--all", "--watch"},
    "Scheduling": {"--concurrency", "--capacity", "--step-timeout", "--on-failure"},
    "Tools and confinement": {"--tools", "--mcp", "--workdir", "--allow-exec"},
    "Model, goal and limits": {"--model", "--base-url", "--budget-usd", "--budget-tokens", "--deadline"},
}


def test_run_help_groups_its_options_in_panels() -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    shown = subprocess.run([sys.executable, "-m", "planweave.cli.main", "run", "--help"], capture_output=True,
                           text=True, timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    found: dict[str, set[str]] = {}
    panel = ""
    for line in shown.stdout.splitlines():
        title = re.match(r"╭─ (.+?) ─", line)
        if title:
            panel = title.group(1)
            continue
        flag = re.match(r"│ (--[a-z-]+)", line)
        if flag:
            found.setdefault(panel, set()).add(flag.group(1))
    assert found.pop("Options") == {"--help"}
    assert found == PANELS
