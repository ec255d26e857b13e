"""Write docs/api.md, the reference of planweave's public Python API, from the docstrings of ``planweave.__all__``.

    .venv/bin/python scripts/api_docs.py          # rewrite docs/api.md
    .venv/bin/python scripts/api_docs.py --check  # exit 1 if docs/api.md is not what this would write

Every name of ``planweave.__all__`` gets a section, in that order: its kind, its signature and its docstring; a class
also each public method and property that planweave defines on it (those inherited from ``object``, ``tuple``,
``Exception`` or pydantic's ``BaseModel`` are left out). A constant's documentation is the string that follows its
assignment in the module that defines it. Only the standard library (``inspect``, ``ast``) is used; nothing is run
but imports. ``tests/test_public_api.py`` fails while the committed docs/api.md differs from what this writes.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ForwardRef

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "api.md"
HEADER = """\
# Python API reference

Generated from the docstrings by `scripts/api_docs.py` (run `.venv/bin/python scripts/api_docs.py` after changing a
public name or its docstring; `tests/test_public_api.py` fails while this file is out of date). Every name here is in
`planweave.__all__`, and every public name of the `planweave` package is here. The README's "From Python" shows them
at work; docs/ARCHITECTURE.md says what lies behind them.
"""

KINDS = {"async function": "async functions", "function": "functions", "class": "classes", "protocol": "protocols",
         "exception": "exceptions", "constant": "constants"}


@dataclass(frozen=True)
class Entry:
    """One documented name: a public name of the package, or a member of one of its classes."""

    name: str
    kind: str  # class, protocol, exception, function, async function, method, property, constant
    signature: str
    doc: str
    members: tuple[Entry, ...] = field(default=())


class _Source(str):
    """An annotation as its source text (``from __future__ import annotations``): shown bare, not quoted."""

    def __repr__(self) -> str:
        return str(self)


def _bare(annotation: Any) -> Any:
    if isinstance(annotation, ForwardRef):  # a NamedTuple's fields
        return _Source(annotation.__forward_arg__)
    return _Source(annotation) if isinstance(annotation, str) else annotation


def _stable(default: Any) -> Any:
    """A set's default shown in sorted order (its own order changes with the interpreter's string hashing)."""
    if isinstance(default, set | frozenset):
        return _Source(f"{type(default).__name__}({{{', '.join(repr(v) for v in sorted(default, key=repr))}}})")
    return default


def _signature(obj: Callable[..., Any], name: str) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    signature = signature.replace(
        parameters=[p.replace(annotation=_bare(p.annotation), default=_stable(p.default))
                    for p in signature.parameters.values()],
        return_annotation=_bare(signature.return_annotation))
    text = str(signature)
    if " at 0x" in text:  # a default whose repr holds an address would make the file differ at every write
        raise SystemExit(f"api_docs: the signature of {name} shows an object's address: {text}")
    return f"{name}{text}"


def _model_signature(cls: Any) -> str:
    """A pydantic model's keyword fields, from their source annotations (pydantic's own ``__signature__`` is built
    lazily and reads differently depending on what was imported before)."""
    params = []
    for name, info in cls.model_fields.items():
        annotation = next((str(vars(k)["__annotations__"][name]) for k in cls.__mro__
                           if name in vars(k).get("__annotations__", {})), "Any")
        if info.is_required():
            default = ""
        elif info.default_factory is not None:
            default = " = <factory>"
        else:
            default = f" = {_stable(info.default)!r}"
        params.append(f"{name}: {annotation}{default}")
    return f"{cls.__name__}(*, {', '.join(params)})"


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        return "protocol" if getattr(obj, "_is_protocol", False) else "class"
    if inspect.iscoroutinefunction(obj) or inspect.isasyncgenfunction(obj):
        return "async function"
    if callable(obj):
        return "function"
    return "constant"


def _constant_doc(name: str) -> str:
    """The string after ``name = ...`` in the planweave module that assigns it (a constant has no docstring)."""
    for module_name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not module_name.startswith("planweave") or path is None or not path.endswith(".py"):
            continue
        source = Path(path).read_text(encoding="utf-8")
        if f"{name} = " not in source:
            continue
        body = ast.parse(source).body
        for node, after in itertools.pairwise(body):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(after, ast.Expr) \
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                return inspect.cleandoc(after.value.value)
    return ""


def _members(cls: type) -> Iterator[Entry]:
    """The public methods and properties planweave's classes in ``cls``'s MRO define, in definition order."""
    seen: set[str] = set()
    for owner in cls.__mro__:
        if not owner.__module__.startswith("planweave"):
            continue
        for name, value in vars(owner).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, property | staticmethod | classmethod) or inspect.isfunction(value):
                target: Callable[..., Any] | None
                if isinstance(value, property):
                    target = value.fget
                elif isinstance(value, staticmethod | classmethod):
                    target = value.__func__
                else:
                    target = value
                if target is None:
                    continue
                kind = "property" if isinstance(value, property) else (
                    "async method" if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)
                    else "method")
                signature = f"{cls.__name__}.{name}" if kind == "property" else \
                    _signature(target, f"{cls.__name__}.{name}")
                yield Entry(f"{cls.__name__}.{name}", kind, signature, inspect.getdoc(target) or "")
            elif type(value).__name__ == "cached_property":
                yield Entry(f"{cls.__name__}.{name}", "property", f"{cls.__name__}.{name}",
                            inspect.getdoc(value.func) or "")


def entries() -> list[Entry]:
    """Every name of ``planweave.__all__``, documented as docs/api.md shows it."""
    import planweave

    found = []
    for name in planweave.__all__:
        obj = getattr(planweave, name)
        kind = _kind(obj)
        if kind == "constant":
            found.append(Entry(name, kind, f"{name} = {obj!r}", _constant_doc(name)))
            continue
        own_init = kind != "protocol" and inspect.isclass(obj) and obj.__module__.startswith("planweave") and (
            "__init__" in vars(obj) or "__new__" in vars(obj) or hasattr(obj, "model_fields")
            or hasattr(obj, "__dataclass_fields__") or hasattr(obj, "_fields"))
        if hasattr(obj, "model_fields"):
            signature = _model_signature(obj)
        else:
            signature = _signature(obj, name) if not inspect.isclass(obj) or own_init else name
        members = tuple(_members(obj)) if inspect.isclass(obj) else ()
        found.append(Entry(name, kind, signature, inspect.getdoc(obj) or "", members))
    return found


def render() -> str:
    """docs/api.md as this script writes it."""
    lines = [HEADER, "## Contents", ""]
    everything = entries()
    for kind, label in KINDS.items():
        names = [f"[`{e.name}`](#{e.name.lower()})" for e in everything if e.kind == kind]
        if names:
            lines.append(f"- {label}: " + ", ".join(names))
    lines.append("")
    for entry in everything:
        lines += [f"## {entry.name}", "", f"*{entry.kind}*", "", "```python", entry.signature, "```", "",
                  entry.doc, ""]
        for member in entry.members:
            lines += [f"### {member.name}", "", f"*{member.kind}*", "", "```python", member.signature, "```", ""]
            if member.doc:
                lines += [member.doc, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run .venv/bin/python scripts/api_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main(sys.argv))
