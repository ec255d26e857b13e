"""Limits on plan documents: JSON values only, bounded nesting and size, valid Unicode; and where in its file each
part of a document was written, to place problems at their line and column (pure, no I/O)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planweave.core.errors import PlanProblem

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


# -- positions ---------------------------------------------------------------------------------------------------
Position = tuple[int, int]
"""A 1-based line and column in a plan file."""

DocumentPath = tuple[str, ...]
"""A place in a plan document, every part as text: ``("steps", "3", "args", "url")`` for ``steps[3].args.url``."""

_PATH_SEPARATORS = re.compile(r"[.\[\]]+")


def path_parts(where: str) -> DocumentPath:
    """The parts of a problem's field or a document path: ``steps[3].args.url`` (:func:`document_problems`) and
    ``retry.on.0`` (pydantic's locations) alike. A key holding a dot reads as two parts (placed at its parent)."""
    return tuple(part for part in _PATH_SEPARATORS.split(where) if part)


class Positions:
    """Where each part of one plan document starts in its file (read from the parser's marks by the loader): a key's
    position for an object's entry, an item's for a list's."""

    def __init__(self, marks: Mapping[DocumentPath, Position]) -> None:
        self._marks = marks

    def at(self, path: DocumentPath) -> Position | None:
        """The position of ``path``, else of the nearest part above it that has one (a key under an alias, a key
        holding a dot); None if none does."""
        for end in range(len(path), 0, -1):
            found = self._marks.get(path[:end])
            if found is not None:
                return found
        return None

    def of(self, index: int | None, field: str) -> Position | None:
        """The position of ``field`` in the step at ``index`` of ``steps`` (None: a field of the plan itself)."""
        base: DocumentPath = () if index is None else ("steps", str(index))
        return self.at(base + path_parts(field))


_REFERENCE_OPENING = re.compile(r"^(\$\{[^}]*\})")


def problem_path(problem: PlanProblem, raw_step: Any) -> str:
    """Where in its step (``raw_step``, as written) ``problem`` is: its field, or for a reference found in the
    arguments (``args: ${serch.out} refers to ...``) the argument that holds it (``args.x``)."""
    opening = _REFERENCE_OPENING.match(problem.message)
    if opening is None or problem.field not in ("args", "fallback.args") or not isinstance(raw_step, Mapping):
        return problem.field
    args = raw_step.get("args") if problem.field == "args" else raw_step.get("fallback")
    if problem.field == "fallback.args":
        args = args.get("args") if isinstance(args, Mapping) else None
    found = _holding(args, opening.group(1), 0)
    return problem.field if found is None else ".".join((problem.field, *found))


def _holding(value: Any, text: str, depth: int) -> list[str] | None:
    """The path of the first text under ``value`` that contains ``text``, or None."""
    if isinstance(value, str):
        return [] if text in value else None
    if depth >= MAX_DEPTH or not isinstance(value, Mapping | list):
        return None
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, child in items:
        found = _holding(child, text, depth + 1)
        if found is not None:
            return [str(key), *found]
    return None


def placed(problem: PlanProblem, position: Position | None) -> PlanProblem:
    """``problem`` at ``position`` (unchanged if it has a line already or the position is unknown)."""
    if position is None or problem.line is not None:
        return problem
    return dataclasses.replace(problem, line=position[0], column=position[1])


def step_indices(data: Any) -> dict[str, list[int]]:
    """Per step id, the indices in the document's ``steps`` of the steps giving it (in order)."""
    found: dict[str, list[int]] = {}
    steps = data.get("steps") if isinstance(data, Mapping) else None
    if isinstance(steps, list):
        for index, raw in enumerate(steps):
            if isinstance(raw, Mapping) and isinstance(raw.get("id"), str):
                found.setdefault(raw["id"], []).append(index)
    return found


def place_problems(problems: Iterable[PlanProblem], data: Any, positions: Positions) -> list[PlanProblem]:
    """Each problem of ``data`` placed where its step (and field) is written, in plan order.

    A problem names its step by id (``#3`` for the third step when it has none): the first step giving that id,
    except for a repeated id's own problem (field ``id``, one per repetition, in order), placed at the repetition.
    """
    indices = step_indices(data)
    repeated: dict[str, int] = {}
    located: list[PlanProblem] = []
    for problem in problems:
        index: int | None = None
        if problem.step:
            given = indices.get(problem.step, ())
            if problem.field == "id" and len(given) > 1:
                seen = repeated[problem.step] = repeated.get(problem.step, 0) + 1
                index = given[min(seen, len(given) - 1)]
            elif given:
                index = given[0]
            elif problem.step.startswith("#") and problem.step[1:].isdigit():
                index = int(problem.step[1:]) - 1
            else:
                located.append(problem)
                continue
        steps = data.get("steps") if isinstance(data, Mapping) else None
        raw = steps[index] if index is not None and isinstance(steps, list) and index < len(steps) else None
        located.append(placed(problem, positions.of(index, problem_path(problem, raw))))
    return in_plan_order(located)


def in_plan_order(problems: Sequence[PlanProblem]) -> list[PlanProblem]:
    """``problems`` in the order of the file: those without a position first (as found), then by line and column;
    problems at one position keep their order (a step's schema problems before its semantic ones)."""
    return sorted(problems, key=lambda p: (-1, 0) if p.line is None else (p.line, p.column or 0))
