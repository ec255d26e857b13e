"""What the terminal shows of a run never holds this process's secrets, even where the live plan does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SECRET = "sk-test-9f8e7d6c5b4a"


def test_the_live_view_header_hides_a_secret_in_the_plan_name(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(f"name: deploy {SECRET}\nsteps:\n  - {{id: a, tool: noop, args: {{x: 1}}}}\n")
    done = subprocess.run([sys.executable, "-m", "planweave.cli.main", "run", "plan.yaml", "--journal", "memory://"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "OPENAI_API_KEY": SECRET, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "deploy ***" in done.stdout
    assert SECRET not in done.stdout + done.stderr
