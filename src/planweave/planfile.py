"""Reading plan files (YAML or JSON) from disk into plan specs.

Every input either gives a :class:`PlanSpec` or raises :class:`PlanInvalid` (a :class:`PlanError`) naming the file
and, where known, the line and column: undecodable bytes, syntax errors, nesting deeper than
:data:`~planweave.plan.document.MAX_DEPTH`, YAML aliases that refer to themselves or expand past
:data:`~planweave.plan.document.MAX_VALUES`, integers longer than Python's 4,300-digit limit, lone surrogates,
files larger than :data:`MAX_PLAN_BYTES`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import Node, ScalarNode

from planweave.errors import PlanInvalid, PlanProblem
from planweave.plan.document import MAX_DEPTH, document_problems
from planweave.plan.graph import parse_plan_document
from planweave.plan.model import PlanSpec

MAX_PLAN_BYTES = 16 * 1024 * 1024
"""The largest plan file read (16 MiB): a plan is a program, not a data set."""

_YAML_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class _PlanYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the limits and the YAML 1.2 core scalars plans need.

    - only ``true``/``false`` are booleans (YAML 1.1 also reads ``on``, ``yes``, ``no``, ``off``: the retry key
      ``on:`` would become ``True``);
    - dates stay text (``2001-02-30`` would otherwise raise a bare ``ValueError``; JSON has no dates);
    - nesting deeper than :data:`MAX_DEPTH` is a syntax error at its position, before Python's recursion limit.
    """

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", self.get_mark())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_str_scalar(self, node: Node) -> str:
        """A scalar read as its text (used for timestamps)."""
        assert isinstance(node, ScalarNode)
        return str(node.value)


_PlanYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_PlanYamlLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _YAML_BOOL, list("tTfF"))
_PlanYamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _PlanYamlLoader.construct_yaml_str_scalar)


# libyaml's parser, when PyYAML was built with it: a 10,000-step plan file read in ~58 us a step instead of ~240
# (docs/benchmarks.md, "Whole process"). The same resolvers and constructors as _PlanYamlLoader; its depth limit is
# a first pass over libyaml's events (its composer recurses in C, past Python's recursion limit). Anything libyaml
# refuses, or a document nested too deep, is read again by _PlanYamlLoader: errors keep its messages and positions.
_CLoader: type[Any] | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _CPlanYamlLoader(yaml.CSafeLoader):
        """libyaml's safe loader with :class:`_PlanYamlLoader`'s scalars (no depth check: see :func:`_parse_yaml`)."""

    _CPlanYamlLoader.yaml_implicit_resolvers = _PlanYamlLoader.yaml_implicit_resolvers
    _CPlanYamlLoader.yaml_constructors = _PlanYamlLoader.yaml_constructors
    _CLoader = _CPlanYamlLoader

_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _within_depth(text: str) -> bool:
    """True if no collection in ``text`` is nested deeper than :data:`MAX_DEPTH` (libyaml's events, no nodes)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif isinstance(event, _CLOSES):
            depth -= 1
    return True


def _parse_yaml(text: str) -> Any:
    """YAML through libyaml when it is there and the document is fine; else (and for every error) PyYAML's own."""
    if _CLoader is not None:
        try:
            if _within_depth(text):
                return yaml.load(text, Loader=_CLoader)  # a SafeLoader's constructors: no arbitrary objects
        except (yaml.YAMLError, ValueError, RecursionError):
            pass  # read again below, for the message the pure-Python parser gives (or its result)
    return yaml.load(text, Loader=_PlanYamlLoader)  # a SafeLoader subclass


def _problem(message: str) -> list[PlanProblem]:
    return [PlanProblem("", "", message)]


def _read_bytes(path: Path, source: str) -> bytes:
    """The file's bytes, refusing files larger than :data:`MAX_PLAN_BYTES` without reading them whole."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise PlanInvalid(_problem(f"cannot read the file: {exc.strerror or exc}"), source) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanInvalid(_problem(f"the file is larger than {MAX_PLAN_BYTES // (1024 * 1024)} MiB"), source)
    return raw


def _decode(raw: bytes, source: str) -> str:
    """The text of a UTF-8 file (a byte-order mark is allowed); other encodings are refused with the position."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = raw[exc.start]
        raise PlanInvalid(
            _problem(f"line {line}, column {column}: the file is not UTF-8 text (byte 0x{byte:02x}); save it as UTF-8"),
            source,
        ) from None


def _parse_text(text: str, as_json: bool) -> Any:
    """Parse JSON or YAML; syntax errors become :class:`PlanProblem` lists via the exceptions below."""
    return json.loads(text) if as_json else _parse_yaml(text)


def _syntax_problem(exc: Exception) -> str:
    """The message for a parse failure, with line and column where the parser knows them."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{getattr(exc, 'problem', None) or exc}"
    if isinstance(exc, RecursionError):
        return f"nested more than {MAX_DEPTH} levels deep"
    if "digits" in str(exc):  # int('9' * 5000): Python refuses integers of more than 4,300 digits
        return "a number has more than 4,300 digits (Python's limit for integers)"
    return f"cannot parse the file: {exc}"


def load_plan_file(path: str | Path) -> PlanSpec:
    """Read and parse a plan file; raise :class:`PlanInvalid` naming the file (and line, for syntax errors)."""
    p = Path(path)
    source = str(path)
    text = _decode(_read_bytes(p, source), source)
    try:
        data = _parse_text(text, p.suffix == ".json")
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise PlanInvalid(_problem(_syntax_problem(exc)), source) from None
    if isinstance(data, dict):  # other top levels get parse_plan_document's message
        problems = document_problems(data)
        if problems:
            raise PlanInvalid(problems, source)
    return parse_plan_document(data, source)
