"""The import rules of docs/ARCHITECTURE.md: the pure core imports no adapter and no I/O library."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "planweave"
CORE = [
    *sorted((SRC / "plan").glob("*.py")),
    SRC / "engine" / "events.py",
    SRC / "engine" / "state.py",
    SRC / "engine" / "scheduler.py",
    SRC / "engine" / "splice.py",
    SRC / "engine" / "context.py",
    SRC / "clock.py",
    SRC / "errors.py",
]
FORBIDDEN = ("planweave.journal", "planweave.tools", "planweave.cli", "planweave.bench", "planweave.engine.runtime",
             "planweave.planning", "planweave.models", "planweave.server",
             "sqlite3", "psycopg", "httpx", "socket", "subprocess", "fastapi", "ray", "yaml", "mcp")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_core_imports_no_adapters_and_no_io() -> None:
    bad = []
    for path in CORE:
        if path.name == "schema.py":
            continue  # writes the committed schema file when run as a script
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


def test_journals_do_not_import_the_runtime_or_tools() -> None:
    bad = []
    for path in sorted((SRC / "journal").glob("*.py")):
        for name in imports(path):
            if name.startswith(("planweave.engine.runtime", "planweave.tools", "planweave.cli")):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_edges() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("cli", "server", "bench"):
            continue
        for name in imports(path):
            if name.startswith(("planweave.cli", "planweave.server", "planweave.bench")):
                bad.append(f"{rel} imports {name}")
    assert not bad, "\n".join(bad)
