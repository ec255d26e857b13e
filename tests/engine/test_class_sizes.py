"""No class of the runtime grows into a god object again (issue 28): at most 25 attributes and 30 methods each.

``Run`` was one (35 attributes, 64 methods in seven roles); it is now a handle over collaborators with one role each
(emission, lifecycle, attempts, people, plan changes, speculation hooks, step sink). Counted from the source: an
attribute is a name assigned or annotated on ``self`` anywhere in the class (or a class-level field), a method any
function defined in its body (properties and dunders included).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "src" / "planweave" / "engine"
MAX_ATTRIBUTES = 25
MAX_METHODS = 30
#: The run's handle and its collaborators: each must exist, so that the test cannot pass by a rename.
RUN_CLASSES = {"Run", "Emission", "Lifecycle", "Attempts", "People", "PlanChanges", "SpeculationHooks", "RunSink",
               "Engine"}


def size(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """The attributes and the methods of ``cls`` as its source defines them."""
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    attributes = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple)
                                                               else [target])]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        attributes |= {t.attr for t in targets
                       if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return attributes, methods


@functools.cache
def classes() -> dict[str, tuple[str, set[str], set[str]]]:
    found = {}
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                attributes, methods = size(node)
                found[node.name] = (path.name, attributes, methods)
    return found


def test_the_counting_sees_what_a_class_holds() -> None:
    source = """
class C:
    field: int
    def __init__(self):
        self.a, self.b = 1, 2
        self.c: int = 3
    @property
    def d(self): return 1
    async def e(self):
        self.f += 1
"""
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert size(cls) == ({"field", "a", "b", "c", "f"}, {"__init__", "d", "e"})


def test_the_run_and_its_collaborators_exist() -> None:
    assert set(classes()) >= RUN_CLASSES


@pytest.mark.parametrize("name", sorted(classes()))
def test_no_runtime_class_is_a_god_object(name: str) -> None:
    module, attributes, methods = classes()[name]
    assert len(attributes) <= MAX_ATTRIBUTES, f"{module}: {name} has {len(attributes)} attributes: {sorted(attributes)}"
    assert len(methods) <= MAX_METHODS, f"{module}: {name} has {len(methods)} methods: {sorted(methods)}"
