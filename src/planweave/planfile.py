"""Reading plan files (YAML or JSON) from disk into plan specs.

Every input either gives a :class:`PlanSpec` or raises :class:`PlanInvalid` (a :class:`PlanError`) naming the file
and, where known, the line and column: undecodable bytes, syntax errors, nesting deeper than
:data:`~planweave.core.plan.document.MAX_DEPTH`, YAML aliases that refer to themselves or expand past
:data:`~planweave.core.plan.document.MAX_VALUES`, integers longer than Python's 4,300-digit limit, lone surrogates,
files larger than :data:`MAX_PLAN_BYTES`, keys given twice in one object. The limits are checked while the text is
read, before a document's Python objects are built: a file of millions of values is refused in a couple of seconds
and a few MB, at the position where the limit was crossed, not after building them all.

Every problem is placed at the line and column of the step or field it concerns (``PlanProblem.line``/``column``):
the loader keeps where each document path starts (the YAML nodes' marks, a pass over the JSON tokens) and
:func:`~planweave.core.plan.document.place_problems`
looks each problem's step and field up in it. :func:`check_plan_file`
(``planweave validate``) reports a file's schema and semantic problems together; :func:`placed_in_source` places the
problems found later, by step id, in the file they name (``run``'s report).
"""

from __future__ import annotations

import json
import re
import time
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.document import (
    MAX_DEPTH,
    MAX_VALUES,
    DocumentPath,
    DuplicateKey,
    Position,
    Positions,
    document_problems,
    in_plan_order,
    place_problems,
    unique_keys,
)
from planweave.core.plan.graph import check_plan_document, parse_plan_document
from planweave.core.plan.model import PlanSpec

MAX_PLAN_BYTES = 16 * 1024 * 1024
"""The largest plan file read (16 MiB): a plan is a program, not a data set."""

_Marks = dict[DocumentPath, Position]  # where each part of a document starts, as the loader reads it

_YAML_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_TEXT_TAGS = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:timestamp"})  # keys read as text (dates too)
# A document refused by libyaml is read again by the pure-Python loader for its messages only up to this size: the
# pure-Python parser takes about 4 s a MiB.
_REREAD_BYTES = 256 * 1024
_CHECK_EVERY = 4096  # values read between two looks at the clock


class _Refused(ComposerError):
    """The text breaks a limit of plan documents (values, time) or gives a key twice: reported as it is, never read
    again by another parser."""


class _Reading:
    """What a document read so far has cost: its values (as :func:`document_problems` counts them, aliases once) and
    the time, against :data:`MAX_VALUES` and an optional time limit."""

    def __init__(self, time_limit: float | None) -> None:
        self.values = 0
        self.time_limit = time_limit
        self.deadline = None if time_limit is None else time.monotonic() + time_limit

    def count(self, n: int, mark: Any) -> None:
        """Add ``n`` values read at ``mark``; raise :class:`_Refused` past a limit."""
        before = self.values
        self.values += n
        if self.values > MAX_VALUES:
            raise _Refused(None, None, f"the document holds more than {MAX_VALUES:,} values (the limit of plan "
                                       "documents): a plan is a program, not a data set", mark)
        if self.deadline is not None and before // _CHECK_EVERY != self.values // _CHECK_EVERY:
            self.check_time(mark)

    def check_time(self, mark: Any) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Refused(None, None, f"reading the document took longer than {self.time_limit:g} s (the limit "
                                       "of plan documents here); it stopped", mark)


class _StrictMappings:
    """The constructor side of both YAML loaders: a key given twice in one mapping is refused at its line (a later
    value would silently replace the earlier: ``steps:`` twice ran only the second list). Merge keys (``<<``) may
    still be overridden: that is what they are for."""

    reading: _Reading | None = None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[str, Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag not in _TEXT_TAGS:
                continue  # a merge, or a key that is not text (refused by document_problems)
            key = key_node.value  # the text such a key is read as
            first = seen.get(key)
            if first is not None:
                raise _Refused("while reading a mapping", node.start_mark,
                               f"the key {key!r} is given twice in this object (first on line {first.line + 1}): "
                               "remove one", key_node.start_mark)
            seen[key] = key_node.start_mark
        if self.reading is not None:
            self.reading.check_time(node.start_mark)
        return super().construct_mapping(node, deep)  # type: ignore[misc, no-any-return]


class _PlanYamlLoader(_StrictMappings, yaml.SafeLoader):
    """PyYAML's safe loader with the limits and the YAML 1.2 core scalars plans need.

    - only ``true``/``false`` are booleans (YAML 1.1 also reads ``on``, ``yes``, ``no``, ``off``: the retry key
      ``on:`` would become ``True``);
    - dates stay text (``2001-02-30`` would otherwise raise a bare ``ValueError``; JSON has no dates);
    - nesting deeper than :data:`MAX_DEPTH` is a syntax error at its position, before Python's recursion limit;
    - more than :data:`MAX_VALUES` values, or more time than ``reading`` allows, stop the composition there;
    - a key given twice in one mapping is refused at its position.
    """

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", self.get_mark())
            # A value: an item of a sequence, or a mapping's value (its key is composed with index None).
            if self.reading is not None and parent is not None and (index is not None
                                                                    or not isinstance(parent, MappingNode)):
                self.reading.count(1, self.get_mark())
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
# a first pass over libyaml's events (its composer recurses in C, past Python's recursion limit), which also counts
# the values and looks at the clock, so that a document too large is refused before its nodes are built. Anything
# libyaml refuses, or a document nested too deep, is read again by _PlanYamlLoader when it is small: errors keep its
# messages and positions.
_CLoader: type[Any] | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _CPlanYamlLoader(_StrictMappings, yaml.CSafeLoader):
        """libyaml's safe loader with :class:`_PlanYamlLoader`'s scalars (no depth check: see :func:`_parse_yaml`)."""

    _CPlanYamlLoader.yaml_implicit_resolvers = _PlanYamlLoader.yaml_implicit_resolvers
    _CPlanYamlLoader.yaml_constructors = _PlanYamlLoader.yaml_constructors
    _CLoader = _CPlanYamlLoader

_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


_NODES = (yaml.ScalarEvent, yaml.AliasEvent, *_OPENS)
_KEY, _VALUE, _ITEM = 0, 1, 2  # what the next node of an open collection is


def _within_limits(text: str, reading: _Reading) -> bool:
    """True if no collection in ``text`` is nested deeper than :data:`MAX_DEPTH` (libyaml's events, no nodes);
    raises :class:`_Refused` where the document passes :data:`MAX_VALUES` values or its time runs out."""
    expect: list[int] = []  # per open collection
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, _NODES):
            if expect:
                top = expect[-1]
                if top == _KEY:
                    expect[-1] = _VALUE
                else:
                    if top == _VALUE:
                        expect[-1] = _KEY
                    reading.count(1, event.start_mark)
            if isinstance(event, _OPENS):
                expect.append(_KEY if isinstance(event, yaml.MappingStartEvent) else _ITEM)
                if len(expect) > MAX_DEPTH:
                    return False
        elif isinstance(event, _CLOSES):
            expect.pop()
    return True


def _parse_yaml(text: str, reading: _Reading | None = None, marks: _Marks | None = None) -> Any:
    """YAML through libyaml when it is there and the document is fine; else (and for every error in a small
    document) PyYAML's own. ``marks``, when given, gets where each part of the document starts."""
    reading = reading or _Reading(None)
    if _CLoader is not None:
        try:
            if _within_limits(text, reading):
                return _load(_CLoader, text, reading, marks)  # a SafeLoader's constructors: no arbitrary objects
        except _Refused:
            raise  # the pure-Python loader would say the same, slower
        except (yaml.YAMLError, ValueError, RecursionError):
            if len(text) > _REREAD_BYTES:
                raise
            # read again below, for the message the pure-Python parser gives (or its result)
        reading = _Reading(reading.time_limit) if reading.deadline is None else reading
        reading.values = 0
    return _load(_PlanYamlLoader, text, reading, marks)  # a SafeLoader subclass


def _load(loader_class: type[Any], text: str, reading: _Reading, marks: _Marks | None = None) -> Any:
    loader = loader_class(text)
    loader.reading = reading
    try:
        if marks is None:
            return loader.get_single_data()
        node = loader.get_single_node()  # what get_single_data does, with the nodes' marks read in between
        if node is None:
            return None
        marks.clear()
        marks.update(_node_marks(node))
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
            [_placed_message("", f"line {line}, column {column}: the file is not UTF-8 text (byte 0x{byte:02x}); "
                                 "save it as UTF-8")],
            source,
        ) from None


class _DuplicateJsonKey(ValueError):
    """A JSON object gives a key twice; the message names it and, where found, its line and column."""


class _JsonObjects:
    """``object_pairs_hook`` for :func:`json.loads`: counts the values of objects and refuses a key given twice."""

    def __init__(self, text: str, reading: _Reading) -> None:
        self.text = text
        self.reading = reading

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        try:
            obj = unique_keys(pairs)
        except DuplicateKey as exc:
            raise _DuplicateJsonKey(_json_duplicate(self.text) or str(exc)) from None
        try:
            self.reading.count(len(pairs), None)
        except _Refused as exc:
            raise ValueError(exc.problem) from None
        return obj


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]')


def _json_duplicate(text: str) -> str | None:
    """Where the first key given twice in one object of the JSON ``text`` is, as a problem, or None.

    A second pass over the tokens (strings and punctuation), only once a duplicate is known: the JSON parser tells
    no position to its object hook.
    """
    frames: list[tuple[dict[str, int], list[bool]] | None] = []  # per open object: its keys' offsets, expecting a key
    for token in _JSON_TOKEN.finditer(text):
        t = token.group()
        if t == "{":
            frames.append(({}, [True]))
        elif t == "[":
            frames.append(None)
        elif t in "}]":
            if frames:
                frames.pop()
        elif frames and frames[-1] is not None:
            keys, expecting = frames[-1]
            if t == ",":
                expecting[0] = True
            elif t != ":" and expecting[0]:
                expecting[0] = False
                key = json.loads(t)
                if key in keys:
                    line, column = _line_column(text, token.start())
                    first, _ = _line_column(text, keys[key])
                    return (f"line {line}, column {column}: the key {key!r} is given twice in this object (first on "
                            f"line {first}): remove one")
                keys[key] = token.start()
    return None


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of ``offset`` in ``text``."""
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _parse_text(text: str, as_json: bool, reading: _Reading | None = None, marks: _Marks | None = None) -> Any:
    """Parse JSON or YAML; syntax errors become :class:`PlanProblem` lists via the exceptions below."""
    reading = reading or _Reading(None)
    if as_json:
        data = json.loads(text, object_pairs_hook=_JsonObjects(text, reading))
        if marks is not None:
            marks.update(_json_positions(text))
        return data
    return _parse_yaml(text, reading, marks)


def _syntax_problem(exc: Exception) -> str:
    """The message for a parse failure, with line and column where the parser knows them."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if isinstance(exc, _DuplicateJsonKey) or (isinstance(exc, ValueError) and "a plan is a program" in str(exc)):
        return str(exc)
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{getattr(exc, 'problem', None) or exc}"
    if isinstance(exc, RecursionError):
        return f"nested more than {MAX_DEPTH} levels deep"
    if "digits" in str(exc):  # int('9' * 5000): Python refuses integers of more than 4,300 digits
        return "a number has more than 4,300 digits (Python's limit for integers)"
    return f"cannot parse the file: {exc}"


def plan_document(text: str, source: str, *, as_json: bool = False, time_limit: float | None = None,
                  field: str = "", marks: _Marks | None = None) -> Any:
    """The plan document a plan file's text holds, checked (:func:`document_problems`); raise :class:`PlanInvalid`
    naming ``source`` (and ``field``, the problems' field: the server's ``plan_yaml``) and the line where known.

    Refused before the document is built: text longer than :data:`MAX_PLAN_BYTES`, more than :data:`MAX_VALUES`
    values, a key given twice in one object, and (``time_limit`` seconds, checked while reading) a read that takes
    longer. JSON is read as YAML when ``as_json`` is false (YAML holds it). ``marks``, when given, gets where
    each part of the document starts (for :class:`~planweave.core.plan.document.Positions`), read in the same pass.
    """
    if len(text) > MAX_PLAN_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_PLAN_BYTES:
        raise PlanInvalid([PlanProblem("", field, f"the plan is larger than {MAX_PLAN_BYTES // (1024 * 1024)} MiB "
                                                  "(the limit of plan documents)")], source)
    try:
        data = _parse_text(text, as_json, _Reading(time_limit), marks)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise PlanInvalid([_placed_message(field, _syntax_problem(exc))], source) from None
    if isinstance(data, dict):  # other top levels get parse_plan_document's message
        problems = document_problems(data)
        if problems:
            raise PlanInvalid(problems, source)
    return data


_POSITION_OPENING = re.compile(r"^line (\d+), column (\d+): ")


def _placed_message(field: str, message: str) -> PlanProblem:
    """A problem with ``message``, placed at the position the message opens with (syntax errors name theirs)."""
    opening = _POSITION_OPENING.match(message)
    if opening is None:
        return PlanProblem("", field, message)
    return PlanProblem("", field, message, int(opening.group(1)), int(opening.group(2)))


def load_plan_file(path: str | Path) -> PlanSpec:
    """Read and parse a plan file; raise :class:`PlanInvalid` naming the file, each problem placed at its line and
    column."""
    p = Path(path)
    source = str(path)
    text = _decode(_read_bytes(p, source), source)
    as_json = p.suffix == ".json"
    try:
        data = plan_document(text, source, as_json=as_json)
    except PlanInvalid as exc:
        raise _placed(exc, text, as_json) from None
    try:
        return parse_plan_document(data, source)
    except PlanInvalid as exc:
        raise _placed(exc, text, as_json, data) from None


def _placed(error: PlanInvalid, text: str, as_json: bool, data: Any = None) -> PlanInvalid:
    """``error`` with its problems placed at their lines in ``text`` (the file read again, only on this path)."""
    if all(problem.line is not None for problem in error.problems):
        return error
    try:
        positions = document_positions(text, as_json)
    except (ValueError, yaml.YAMLError, RecursionError):  # the positions are a help: without them, as it was
        return error
    return PlanInvalid(place_problems(error.problems, data, positions), error.source)


def placed_in_source(error: PlanInvalid) -> PlanInvalid:
    """``error`` with each problem placed at its line and column in the plan file it names (``source``), when that
    is a readable plan file; else ``error`` as it is. For the problems of a plan read from a file but found later
    (``validate_plan``'s, by step id): the CLI edge places them before it shows them."""
    if all(problem.line is not None for problem in error.problems):
        return error
    path = Path(error.source)
    try:
        if not path.is_file():
            return error
        text = _decode(_read_bytes(path, error.source), error.source)
        as_json = path.suffix == ".json"
        return _placed(error, text, as_json, plan_document(text, error.source, as_json=as_json))
    except (PlanInvalid, OSError):
        return error


# -- where each part of a document is ---------------------------------------------------------------------------
def document_positions(text: str, as_json: bool) -> Positions:
    """Where each part of the document in ``text`` (read fine before) starts: the YAML parser's marks, or for JSON
    a pass over its tokens."""
    if as_json:
        return Positions(_json_positions(text))
    loader = (_CLoader or _PlanYamlLoader)(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    return Positions({} if root is None else _node_marks(root))


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _node_marks(root: Node) -> _Marks:
    """Each path of the YAML document's nodes and where it starts (a key's mark for an entry, an item's for a list
    item). A node an alias repeats is walked once: what lies under a second use is placed at the alias."""
    marks: _Marks = {}
    seen: set[int] = set()
    stack: list[tuple[DocumentPath, Node, bool]] = [((), root, False)]
    while stack:
        path, node, merged = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if key.tag == _MERGE_TAG:  # `<<: *base`: its keys are this mapping's, unless written here too
                    merges = value.value if isinstance(value, SequenceNode) else [value]
                    stack.extend((path, item, True) for item in merges)
                elif isinstance(key, ScalarNode):
                    child = (*path, str(key.value))
                    where = (key.start_mark.line + 1, key.start_mark.column + 1)
                    if merged:
                        marks.setdefault(child, where)
                    else:
                        marks[child] = where
                    stack.append((child, value, False))
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, str(index))
                marks[child] = (item.start_mark.line + 1, item.start_mark.column + 1)
                stack.append((child, item, False))
    return marks


_JSON_PARTS = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[^\s{}\[\],:"]+')


class _JsonFrame:
    """An open object or list while :func:`_json_positions` reads the tokens."""

    __slots__ = ("index", "is_object", "key", "path", "waiting")

    def __init__(self, path: DocumentPath, is_object: bool) -> None:
        self.path = path
        self.is_object = is_object
        self.waiting = True  # for a key (object) or an item (list)
        self.key = ""
        self.index = 0


def _json_positions(text: str) -> _Marks:
    """Each path of the JSON document (valid: read before) and where it starts: its key, or its list item."""
    marks: _Marks = {}
    frames: list[_JsonFrame] = []
    lines = _LineStarts(text)
    for token in _JSON_PARTS.finditer(text):
        t = token.group()
        top = frames[-1] if frames else None
        if t in "}]":
            frames.pop()
            continue
        if t == ",":
            if top is not None:
                top.waiting = True
                top.index += 0 if top.is_object else 1
            continue
        if t == ":":
            continue
        path: DocumentPath = ()
        if top is not None:
            if top.is_object:
                if top.waiting:  # a key
                    top.key, top.waiting = json.loads(t), False
                    marks[(*top.path, top.key)] = lines.position(token.start())
                    continue
                path = (*top.path, top.key)
            else:
                path = (*top.path, str(top.index))
                if top.waiting:
                    marks[path] = lines.position(token.start())
                    top.waiting = False
        if t in "{[":
            frames.append(_JsonFrame(path, t == "{"))
    return marks


class _LineStarts:
    """Offsets to 1-based lines and columns of one text, by bisecting its line starts."""

    def __init__(self, text: str) -> None:
        self.starts = [0, *(match.end() for match in re.finditer("\n", text))]

    def position(self, offset: int) -> Position:
        line = bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1] + 1


# -- checking a plan file ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanFileCheck:
    """Everything wrong with one plan file (``planweave validate``): its problems in plan order, each placed at its
    line and column where known, and how many steps it lists."""

    source: str
    problems: tuple[PlanProblem, ...]
    steps: int
    readable: bool = True  # false: the file could not be read at all (missing, a directory, too large)

    @property
    def valid(self) -> bool:
        return not self.problems


def check_plan_file(path: str | Path, tools: ToolCatalog | None = None,
                    capacities: Mapping[str, int] | None = None) -> PlanFileCheck:
    """Every problem of the plan file at ``path`` at once, schema and semantic, each at its line and column.

    A file that cannot be read gives that one problem (``readable`` false); a syntax error or a document past the
    limits of plan documents gives its problems (nothing else can be checked); else
    :func:`~planweave.core.plan.graph.check_plan_document` with ``tools`` and ``capacities``.
    """
    p = Path(path)
    source = str(path)
    try:
        raw = _read_bytes(p, source)
    except PlanInvalid as exc:
        return PlanFileCheck(source, exc.problems, 0, readable=False)
    as_json = p.suffix == ".json"
    try:
        text = _decode(raw, source)
    except PlanInvalid as exc:
        return PlanFileCheck(source, exc.problems, 0)
    marks: _Marks = {}
    try:
        data = plan_document(text, source, as_json=as_json, marks=marks)
    except PlanInvalid as exc:
        return PlanFileCheck(source, tuple(in_plan_order(_placed(exc, text, as_json).problems)), 0)
    check = check_plan_document(data, tools, capacities, positions=Positions(marks))
    return PlanFileCheck(source, check.problems, check.steps)
