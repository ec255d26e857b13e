"""Start-up stays lean: ``planweave run`` of a plain plan file imports none of the packages it does not use.

Every module below costs start-up time when imported (docs/benchmarks.md, "CLI start-up"); each is imported on
first use instead (``--tiers``, ``--model``, ``--goal``, ``--mcp``, ``serve``, ``bench``...). The check runs in a
fresh interpreter through :func:`planweave.cli.main.main`, as the console script does (only the ``run`` group).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Packages (and their submodules) a one-step plan file with a built-in tool never needs.
HEAVY = (
    "planweave.allocate", "planweave.models", "planweave.planning", "planweave.server", "planweave.tools.mcp",
    "planweave.tools.llm", "planweave.bench", "planweave.workers", "planweave.rollouts", "planweave.forecast",
    "planweave.control", "planweave.memory", "planweave.executors",
    "fastapi", "starlette", "uvicorn", "httpx", "openai", "mcp", "opentelemetry", "ray", "numpy", "asyncpg",
    "psycopg",
)

_SCRIPT = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["planweave", *json.loads(sys.argv[1])]
from planweave.cli.main import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules
                                                 if any(m == h or m.startswith(h + ".") for h in heavy))}))
"""


def _imported(argv: list[str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(argv), json.dumps(HEAVY)],
                          capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_running_a_one_step_plan_file_imports_no_heavy_module(tmp_path: Path) -> None:
    plan = tmp_path / "one.yaml"
    plan.write_text("name: one\nsteps:\n  - id: a\n    tool: noop\n    args: {x: 1}\n", encoding="utf-8")
    result = _imported(["run", str(plan), "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--json"])
    assert result == {"code": 0, "loaded": []}


def test_importing_the_cli_imports_no_heavy_module() -> None:
    code = ("import json, sys\nimport planweave.cli.main\nheavy = " + repr(HEAVY) + "\n"
            "print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
            "for h in heavy))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == []
