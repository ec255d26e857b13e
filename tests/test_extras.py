"""Optional parts: a feature used without its extra names the extra, and start-up imports none of them.

The CLI runs in real subprocesses. A missing extra is simulated by ``sys.modules[name] = None`` before planweave is
imported, which makes both ``importlib.util.find_spec`` and ``import`` see the module as absent, as in a venv
without the extra (``scripts/check-wheel.sh`` checks the same messages from a wheel in a fresh venv).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planweave.extras import EXTRAS, MissingExtra, installed, require

ONE_STEP = "name: one\nsteps:\n  - id: greet\n    tool: noop\n    args: {message: hi}\n"


def planweave_without(hidden: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the ``planweave`` CLI with ``args`` in a process where the modules ``hidden`` cannot be imported."""
    code = (f"import sys\nfor name in {hidden!r}: sys.modules[name] = None\n"
            f"sys.argv = ['planweave', *{list(args)!r}]\nfrom planweave.cli.main import main\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)


def assert_names_extra(proc: subprocess.CompletedProcess[str], extra: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert f"pip install 'planweave[{extra}]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_require_names_the_extra_and_the_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXTRAS, "imaginary", ("json", "planweave_no_such_module.sub"))
    with pytest.raises(MissingExtra) as caught:
        require("imaginary", "the imaginary feature")
    assert str(caught.value) == ("the imaginary feature needs the 'imaginary' extra: pip install "
                                 "'planweave[imaginary]' (from a checkout of the repository: pip install "
                                 "'.[imaginary]'; module 'planweave_no_such_module.sub' is not installed)")
    assert installed("json") and not installed("planweave_no_such_module.sub")


def test_require_passes_when_the_extra_is_installed() -> None:
    require("server", "the server")  # the test environment has [dev], which brings the server


def test_serve_without_the_server_extra_names_it(tmp_path: Path) -> None:
    proc = planweave_without(("fastapi",), "serve", "--port", "0", cwd=tmp_path)
    assert_names_extra(proc, "server")
    assert "the server needs the 'server' extra" in proc.stderr


def test_watch_without_the_server_extra_names_it(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ONE_STEP)
    proc = planweave_without(("uvicorn",), "run", "one.yaml", "--journal", "memory://", "--watch", "--config", "port=0",
                             cwd=tmp_path)
    assert_names_extra(proc, "server")


def test_postgres_journal_without_the_postgres_extra_names_it(tmp_path: Path) -> None:
    proc = planweave_without(("psycopg",), "runs", "--journal", "postgresql://127.0.0.1:9/none", cwd=tmp_path)
    assert_names_extra(proc, "postgres")
    assert "a postgresql:// journal needs the 'postgres' extra" in proc.stderr


def test_postgres_journal_without_the_extra_in_json_mode_prints_one_error_object(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ONE_STEP)
    proc = planweave_without(("psycopg",), "run", "one.yaml", "--journal", "postgresql://127.0.0.1:9/none",
                             "--json", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "planweave[postgres]" in json.loads(proc.stdout)["error"]


def test_mcp_without_the_mcp_extra_names_it(tmp_path: Path) -> None:
    proc = planweave_without(("mcp",), "tools", "list", "--mcp", "files=npx some-server", cwd=tmp_path)
    assert_names_extra(proc, "mcp")
    assert "--mcp (MCP servers) needs the 'mcp' extra" in proc.stderr


def test_tracing_without_the_telemetry_extra_names_it(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ONE_STEP)
    code = ("import os, sys\nsys.modules['opentelemetry.sdk'] = None\nos.environ['OTEL_TRACES_EXPORTER'] = 'console'\n"
            "sys.argv = ['planweave', 'run', 'one.yaml', '--journal', 'memory://']\n"
            "from planweave.cli.main import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert_names_extra(proc, "telemetry")


def test_serve_with_telemetry_without_the_telemetry_extra_names_it(tmp_path: Path) -> None:
    proc = planweave_without(("opentelemetry.sdk",), "serve", "--port", "0", "--telemetry", "--journal", "memory://",
                             cwd=tmp_path)
    assert_names_extra(proc, "telemetry")


def test_a_one_step_run_without_any_extra_succeeds(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ONE_STEP)
    hidden = ("fastapi", "uvicorn", "starlette", "psycopg", "mcp", "opentelemetry", "llama_cpp", "ray")
    proc = planweave_without(hidden, "run", "one.yaml", "--journal", "memory://", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "succeeded"


def test_starting_the_cli_imports_no_optional_or_heavy_library() -> None:
    code = "import sys, planweave.cli.main\nprint(' '.join(sorted(m for m in sys.modules if '.' not in m)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(proc.stdout.split())
    lazy = {"fastapi", "uvicorn", "starlette", "psycopg", "mcp", "opentelemetry", "httpx", "httpcore",
            "jsonschema", "h11", "anyio"}
    assert loaded & lazy == set()


@pytest.mark.parametrize(("module", "hidden", "extra"), [
    ("planweave.server", "fastapi", "server"),
    ("planweave.tools.mcp", "mcp", "mcp"),
])
def test_importing_an_optional_part_without_its_extra_names_it(module: str, hidden: str, extra: str) -> None:
    code = (f"import sys\nsys.modules[{hidden!r}] = None\nfrom planweave.extras import MissingExtra\n"
            f"try:\n    import {module}\nexcept MissingExtra as exc:\n    print(exc.extra)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, extra), proc.stderr
