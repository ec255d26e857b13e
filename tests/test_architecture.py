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
    SRC / "engine" / "speculation.py",
    SRC / "engine" / "splice.py",
    SRC / "engine" / "replies.py",
    SRC / "engine" / "context.py",
    SRC / "clock.py",
    SRC / "errors.py",
    SRC / "control" / "realign.py",
    SRC / "control" / "trigger.py",
    SRC / "control" / "events.py",
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


# -- import cycles and the adapter rule --------------------------------------------------------------------------
# The cycle check counts every import a module can execute: module-level ones and those inside functions (a lazy
# import still runs, and a cycle through it is a cycle as soon as both modules are loaded). Only imports under
# ``if TYPE_CHECKING:`` are exempt: they never run.

ADAPTERS = ("journal", "tools", "models", "executors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(path: Path) -> set[str]:
    """The planweave modules ``path`` can import at run time (``from pkg import sub`` counts as ``pkg.sub``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                visit_orelse(child)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.add(sub if sub in MODULES else child.module)
            visit(child)

    def visit_orelse(node: ast.If) -> None:
        for stmt in node.orelse:
            visit(ast.Module(body=[stmt], type_ignores=[]))

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in MODULES}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles_among_planweave_modules() -> None:
    graph = {name: runtime_imports(path) - {name} for name, path in MODULES.items()}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_adapters_import_only_each_others_public_package() -> None:
    """journal/*, tools/*, models/* may use another adapter only through its package (``planweave.models``).

    Here ``TYPE_CHECKING`` imports count too: an annotation naming another adapter's internals is a dependency."""
    bad = []
    for name, path in MODULES.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in ADAPTERS:
            continue
        for imported in sorted(runtime_imports(path) | {m for m in imports(path) if m.startswith("planweave.")}):
            other = imported.split(".")
            if len(other) > 1 and other[1] in ADAPTERS and other[1] != parts[1] and len(other) > 2:
                bad.append(f"{path.relative_to(SRC)} imports {imported} (use planweave.{other[1]})")
    assert not bad, "\n".join(bad)
