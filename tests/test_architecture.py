"""The import rules of docs/ARCHITECTURE.md: the pure core imports no adapter and no I/O library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "planweave"
CORE = sorted((SRC / "core").rglob("*.py"))
IO = ("sqlite3", "psycopg", "httpx", "socket", "subprocess", "fastapi", "ray", "yaml", "mcp", "asyncpg", "redis")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def core_violations(files: list[Path]) -> list[str]:
    """The folder rule of the core: it imports nothing of planweave outside ``planweave.core``, and no I/O library."""
    bad = []
    for path in files:
        for name in sorted(imports(path)):
            inside = name == "planweave.core" or name.startswith("planweave.core.")
            outside = name.startswith("planweave") and not inside
            if outside or any(name == f or name.startswith(f + ".") for f in IO):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    return bad


def test_core_imports_nothing_outside_the_core() -> None:
    assert CORE, "no core package"
    bad = core_violations(CORE)
    assert not bad, "\n".join(bad)


def test_the_core_rule_sees_a_planted_violation(tmp_path: Path) -> None:
    planted = SRC / "core" / "_planted_violation.py"
    try:
        planted.write_text("from planweave.engine.runtime import Engine\nimport sqlite3\n", encoding="utf-8")
        bad = core_violations([planted])
    finally:
        planted.unlink()
    assert bad == ["core/_planted_violation.py imports planweave.engine.runtime",
                   "core/_planted_violation.py imports sqlite3"]


def test_importing_the_core_loads_no_runtime_journal_or_tool() -> None:
    code = ("import sys\n"
            + "".join(f"import {module_name(p)}\n" for p in CORE)
            + "print(' '.join(sorted(m for m in sys.modules if m.startswith('planweave'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out, "nothing loaded"
    outside = [m for m in out if m != "planweave" and not m.startswith("planweave.core")]
    assert not outside, f"importing the core loaded {outside}"


RUNTIME_MAY_IMPORT = ("planweave.core", "planweave.engine", "planweave.journal")


def test_the_runtime_imports_only_the_core_and_the_journal_protocol() -> None:
    """engine/ is the asyncio runtime: it runs what the core decides on a journal, and composes nothing else (limits,
    models, planning live above it). The one exception: the built-in toolbox, imported lazily as the default catalog
    of an ``Engine`` given no tools."""
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("planweave.engine"):
            continue
        for imported in sorted(runtime_imports(path)):
            if imported.startswith(RUNTIME_MAY_IMPORT):
                continue
            if name == "planweave.engine.runtime" and imported == "planweave.tools":
                continue
            bad.append(f"{path.relative_to(SRC)} imports {imported}")
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


def with_packages(name: str, imported: set[str]) -> set[str]:
    """What importing ``imported`` runs from module ``name``: each module and the package ``__init__`` files above it
    that are not already running (``name``'s own packages are mid-import when it runs)."""
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    if name in PACKAGES:
        own.add(name)
    found: set[str] = set()
    for module in imported:
        parts = module.split(".")
        found.update(p for p in (".".join(parts[:i]) for i in range(2, len(parts) + 1)) if p in MODULES)
    return found - own - {name}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: with_packages(name, runtime_imports(path)) for name, path in modules.items()}


PACKAGES = {module_name(p) for p in SRC.rglob("__init__.py")}


def test_no_import_cycles_among_planweave_modules() -> None:
    cycles = import_cycles(import_graph(MODULES))
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


def test_the_cycle_check_sees_a_cycle_through_a_package_init() -> None:
    """The cycle of old: engine/__init__ imports the runtime, the runtime a journal, the journal an engine module."""
    planted = SRC / "journal" / "_planted_cycle.py"
    try:
        planted.write_text("from planweave.engine.attempt import Failure\n", encoding="utf-8")
        modules = {**MODULES, "planweave.journal._planted_cycle": planted}
        graph = import_graph(modules)
        graph["planweave.engine.runtime"] = graph["planweave.engine.runtime"] | {"planweave.journal._planted_cycle"}
        cycles = import_cycles(graph)
    finally:
        planted.unlink()
    assert any({"planweave.engine", "planweave.journal._planted_cycle"} <= set(c) for c in cycles), cycles
