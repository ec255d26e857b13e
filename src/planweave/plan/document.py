"""Limits on plan documents: JSON values only, bounded nesting and size, valid Unicode (pure, no I/O)."""

from __future__ import annotations

from typing import Any

from planweave.errors import PlanProblem

MAX_DEPTH = 100
"""The deepest nesting of objects and lists a plan document may have."""

MAX_VALUES = 1_000_000
"""The most values (counting every element of every object and list, aliases expanded) a plan document may hold."""

_MAX_PROBLEMS = 20
_SCALAR_TYPES = frozenset({int, float, bool, type(None)})
_FOREIGN_NAMES = {"bytes": "binary data (!!binary)", "set": "a set (!!set)", "tuple": "a pair list (!!pairs/!!omap)"}


def _where(path: tuple[str | int, ...]) -> str:
    """``steps[0].args.x`` for the path ``("steps", 0, "args", "x")``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "the document"


def _bad_text(text: str) -> str | None:
    """Why ``text`` cannot be stored as UTF-8 (a lone surrogate such as ``"\\ud800"`` from JSON), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate (\\u{ord(text[exc.start]):04x}), which is not valid Unicode"
    return None


class DuplicateKey(ValueError):
    """A JSON object gives the same key twice (``json.loads`` would keep the last value silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} is given twice in one object: remove one")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: the object, or :class:`DuplicateKey` naming a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


class _TooLarge(Exception):
    """The walk stopped: the document breaks a structural limit (the problem says which)."""

    def __init__(self, problem: PlanProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def document_problems(data: Any) -> list[PlanProblem]:
    """Everything that makes ``data`` unfit as a plan document read from a file, or an empty list.

    A plan document is made of JSON values (objects with text keys, lists, text, numbers, booleans, null), nested at
    most :data:`MAX_DEPTH` deep, with at most :data:`MAX_VALUES` values once YAML aliases are expanded, containing
    no reference to itself and only valid Unicode. The walk stops at the first structural problem, so a
    self-referencing or exponentially aliased document is refused quickly.
    """
    walk = _Walk()
    try:
        walk.visit(data)
    except _TooLarge as exc:
        walk.problems.append(exc.problem)
    return walk.problems


class _Walk:
    """One depth-first walk over a document; the path is kept as a list and rendered only for problems."""

    def __init__(self) -> None:
        self.count = 0
        self.problems: list[PlanProblem] = []
        self.path: list[str | int] = []
        self.above: set[int] = set()

    def _report(self, message: str) -> None:
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(PlanProblem("", _where(tuple(self.path)), message))

    def visit(self, value: Any) -> None:
        """Check ``value`` and everything under it (recursion is bounded by :data:`MAX_DEPTH`)."""
        kind = type(value)
        if kind is str:
            bad = _bad_text(value)
            if bad:
                self._report(bad)
        elif kind is dict or kind is list:
            self._visit_container(value)
        elif kind not in _SCALAR_TYPES:
            name = _FOREIGN_NAMES.get(kind.__name__, f"a {kind.__name__} value")
            self._report(f"{name} is not allowed: plans hold JSON values only")

    def _visit_container(self, value: dict[Any, Any] | list[Any]) -> None:
        self.count += len(value)
        if self.count > MAX_VALUES:
            raise _TooLarge(PlanProblem("", "", f"the document holds more than {MAX_VALUES:,} values "
                                                "(YAML aliases expanded)"))
        if id(value) in self.above:
            raise _TooLarge(PlanProblem("", _where(tuple(self.path)),
                                        "refers to itself (a YAML alias inside its own anchor)"))
        if len(self.path) >= MAX_DEPTH:
            raise _TooLarge(PlanProblem("", _where(tuple(self.path[:8])) + "...",
                                        f"nested more than {MAX_DEPTH} levels deep"))
        self.above.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            self.path.append(key if type(key) is str or isinstance(value, list) else repr(key))
            if isinstance(value, dict) and type(key) is not str:
                self._report(f"the key {key!r} is not text (write it in quotes)")
            elif type(key) is str and _bad_text(key):
                self._report(f"a key {_bad_text(key)}")
            else:
                self.visit(child)
            self.path.pop()
        self.above.discard(id(value))
