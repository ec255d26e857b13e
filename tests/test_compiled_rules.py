"""The modules setup.py compiles with mypyc keep to what mypyc compiles correctly (checked on the sources, so a pure
test run catches it before the compiled suite of scripts/test-compiled.sh does)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compiled_modules() -> list[Path]:
    """The paths listed in setup.py's ``COMPILED``."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets):
            return [ROOT / path for path in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no COMPILED list")


def awaits_in_finally(tree: ast.AST) -> list[int]:
    """Lines of awaits inside a ``finally`` block: mypyc raised a stale CancelledError out of one (mypy 2.4)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.TryStar):
            for stmt in node.finalbody:
                lines += [sub.lineno for sub in ast.walk(stmt) if isinstance(sub, ast.Await | ast.AsyncWith
                                                                              | ast.AsyncFor)]
    return lines


def checked_protocols(tree: ast.AST) -> list[str]:
    """``runtime_checkable`` classes: compiled, a Protocol is a native class, and isinstance checks against it fail
    (plain Protocols, for type checking only, may stay)."""
    def named(node: ast.expr) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(named(d) == "runtime_checkable" for d in node.decorator_list)]


def test_the_compiled_modules_exist() -> None:
    modules = compiled_modules()
    assert modules and all(path.is_file() for path in modules), modules


def test_no_await_in_a_finally_block_of_a_compiled_module() -> None:
    found = {str(p.relative_to(ROOT)): lines for p in compiled_modules()
             if (lines := awaits_in_finally(ast.parse(p.read_text())))}
    assert found == {}, f"await inside finally (move it after the try; see Run._main): {found}"


def test_no_runtime_checked_protocol_in_a_compiled_module() -> None:
    found = {str(p.relative_to(ROOT)): names for p in compiled_modules()
             if (names := checked_protocols(ast.parse(p.read_text())))}
    assert found == {}, f"runtime_checkable protocols belong in engine/protocols.py (interpreted): {found}"


def test_the_checks_see_what_they_look_for() -> None:
    source = ("@typing.runtime_checkable\nclass P(typing.Protocol): ...\nclass Q(Protocol): ...\n"
              "async def f():\n    try:\n        pass\n    finally:\n        await g()\n")
    tree = ast.parse(source)
    assert awaits_in_finally(tree) == [8]
    assert checked_protocols(tree) == ["P"]
