"""References between steps: parse ``${step.path[0]}`` in arguments and resolve them against outputs.

A string that is exactly one reference is replaced by the referenced value itself (any JSON type); a string with
references inside text has each one interpolated (strings as they are, other values as compact JSON). ``$${`` writes
a literal ``${``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_SEGMENT = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(-?\d+)\]|\[\"([^\"]*)\"\]")
_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")

PathPart = str | int


class RefSyntaxError(ValueError):
    """A ``${...}`` expression that cannot be parsed."""


class RefResolutionError(LookupError):
    """A reference points into an output where nothing is."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to step ``step``'s output, optionally a ``path`` into it."""

    step: str
    path: tuple[PathPart, ...]
    text: str

    def resolve(self, outputs: Mapping[str, Any]) -> Any:
        value = outputs[self.step]
        walked = self.step
        for part in self.path:
            if isinstance(part, int):
                if not isinstance(value, list) or not -len(value) <= part < len(value):
                    raise RefResolutionError(
                        f"${{{self.text}}}: {walked} has no index {part} ({_describe(value)})"
                    )
                value = value[part]
                walked += f"[{part}]"
            else:
                if not isinstance(value, Mapping) or part not in value:
                    raise RefResolutionError(f"${{{self.text}}}: {walked} has no key '{part}' ({_describe(value)})")
                value = value[part]
                walked += f".{part}"
        return value


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        keys = ", ".join(map(str, list(value)[:8]))
        return f"an object with keys {keys}" if keys else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


def parse_ref(expr: str) -> Ref:
    """Parse the inside of ``${...}``."""
    text = expr.strip()
    head = _ID.match(text)
    if head is None:
        raise RefSyntaxError(f"'${{{expr}}}' does not start with a step id")
    path: list[PathPart] = []
    pos = head.end()
    while pos < len(text):
        seg = _SEGMENT.match(text, pos)
        if seg is None:
            raise RefSyntaxError(f"'${{{expr}}}': cannot read '{text[pos:]}' (use .key, [index] or [\"key\"])")
        name, index, quoted = seg.groups()
        path.append(int(index) if index is not None else (name if name is not None else quoted))
        pos = seg.end()
    return Ref(head.group(0), tuple(path), text)


@dataclass(frozen=True, slots=True)
class Interpolation:
    parts: tuple[str | Ref, ...]

    def render(self, outputs: Mapping[str, Any]) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                value = part.resolve(outputs)
                out.append(value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        return "".join(out)


def _compile_string(text: str) -> str | Ref | Interpolation:
    if "$" not in text:
        return text
    parts: list[str | Ref] = []
    pos = 0
    for match in _REF.finditer(text):
        parts.append(text[pos : match.start()])
        if match.group(0) == "$${":
            parts.append("${")
        else:
            parts.append(parse_ref(match.group(1)))
        pos = match.end()
    parts.append(text[pos:])
    merged: list[str | Ref] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    if len(merged) == 1 and isinstance(merged[0], Ref):
        return merged[0]
    if all(isinstance(p, str) for p in merged):
        return "".join(p for p in merged if isinstance(p, str))
    return Interpolation(tuple(merged))


Compiled = Any


def compile_args(value: Any) -> tuple[Compiled, tuple[Ref, ...]]:
    """Compile arguments into a template and list the references in it (raises RefSyntaxError)."""
    refs: list[Ref] = []

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            c = _compile_string(v)
            if isinstance(c, Ref):
                refs.append(c)
            elif isinstance(c, Interpolation):
                refs.extend(p for p in c.parts if isinstance(p, Ref))
            return c
        if isinstance(v, Mapping):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    template = walk(value)
    return template, tuple(refs)


def render(template: Compiled, outputs: Mapping[str, Any]) -> Any:
    """Resolve a compiled template against step outputs (raises RefResolutionError)."""
    if isinstance(template, Ref):
        return template.resolve(outputs)
    if isinstance(template, Interpolation):
        return template.render(outputs)
    if isinstance(template, dict):
        return {k: render(x, outputs) for k, x in template.items()}
    if isinstance(template, list):
        return [render(x, outputs) for x in template]
    return template


def render_text(text: str, outputs: Mapping[str, Any], *, max_value_chars: int = 200) -> str:
    """``text`` (an approval's question) with each reference that resolves against ``outputs`` replaced by its value
    (strings as they are, other values as compact JSON, each cut to ``max_value_chars``); a reference that does not
    resolve (no such output yet, no such key, bad syntax) stays as written. ``$${`` is a literal ``${``."""
    if "${" not in text:
        return text

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        try:
            value = parse_ref(match.group(1)).resolve(outputs)
        except (RefSyntaxError, RefResolutionError, KeyError):
            return match.group(0)
        shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return shown if len(shown) <= max_value_chars else shown[: max_value_chars - 1] + "…"

    return _REF.sub(sub, text)


def rename_refs(value: Any, renames: Mapping[str, str]) -> Any:
    """Return ``value`` with references to renamed steps rewritten (``${old.x}`` becomes ``${new.x}``)."""
    if not renames:
        return value
    if isinstance(value, str):
        if "${" not in value:
            return value

        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return match.group(0)
            expr = match.group(1).strip()
            ref = parse_ref(expr)
            if ref.step not in renames:
                return match.group(0)
            return "${" + renames[ref.step] + expr[len(ref.step) :] + "}"

        return _REF.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: rename_refs(v, renames) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rename_refs(v, renames) for v in value]
    return value
