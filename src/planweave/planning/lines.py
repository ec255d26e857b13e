"""Reading a planner's streamed output: one JSON step object per line, parsed as each line completes (pure)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from planweave.core.plan.document import DuplicateKey, unique_keys

# A Markdown list marker ("- ", "* ", "+ ", "1. ", "2) ") in front of what may be a step object.
_BULLET = re.compile(r"^(?:[-*+]|\d{1,3}[.)])\s+")
# Lines that are plainly not steps need no round trip with the model; only these look like an attempted step.
_STEP_HINTS = ('"id"', '"tool"')


@dataclass(frozen=True)
class Line:
    """One complete line of planner output: its number, text, and the step objects in it (or why there are none)."""

    number: int
    text: str
    steps: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    kind: str = "line"  # what is numbered: a line of text, or an ``add_step call`` (planning/tool_calls.py)

    @property
    def where(self) -> str:
        """``line 3``, or ``add_step call 3``: how a rejection names it to the planner."""
        return f"{self.kind} {self.number}"


def _unwrap(text: str) -> str:
    """The line without a Markdown bullet, inline-code backticks or the comma of a JSON array written line by line."""
    text = _BULLET.sub("", text, count=1).strip()
    if len(text) > 1 and text.startswith("`") and text.endswith("`"):
        text = text.strip("`").strip()
    return text.removesuffix(",").rstrip()


def _looks_like_step(text: str) -> bool:
    return text.startswith(("{", "[")) or any(hint in text for hint in _STEP_HINTS)


class LineParser:
    """Feed text chunks as they stream in; get back each complete line that holds steps or a broken step, parsed.

    JSON Lines is the contract: one step object per line (a JSON array of steps on one line is accepted too, and
    ``[]`` is an explicit empty plan). Lines that are plainly not steps are skipped without a word to the model:
    blank lines, Markdown code fences, the ``[`` and ``]`` of an array written one step per line, prose and bullets
    without JSON. A Markdown bullet, inline-code backticks or a trailing comma around a step object are removed. Only
    a line that looks like a step (it starts with ``{`` or ``[``, or mentions ``"id"`` or ``"tool"``) and is not one
    is reported as an error for the repair prompt, with its line number. :attr:`step_lines` counts the lines that
    held steps, so a reply without any can be told apart from an empty plan.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._number = 0
        self.step_lines = 0

    def feed(self, text: str) -> list[Line]:
        """Add streamed text; return the lines it completed that hold steps or errors."""
        self._buffer += text
        *complete, self._buffer = self._buffer.split("\n")
        return [line for raw in complete if (line := self._parse(raw)) is not None]

    def close(self) -> list[Line]:
        """The end of the reply: parse what is left after the last newline."""
        rest, self._buffer = self._buffer, ""
        line = self._parse(rest)
        return [line] if line is not None else []

    def _parse(self, raw: str) -> Line | None:
        self._number += 1
        text = _unwrap(raw.strip())
        if text in ("", "[", "]") or text.startswith("```") or not _looks_like_step(text):
            return None
        try:
            value = json.loads(text, object_pairs_hook=unique_keys)  # {"id": "a", "id": "b"} is not step b
        except json.JSONDecodeError as exc:
            return Line(self._number, text, error=f"line {self._number} is not valid JSON ({exc.msg}): {text[:120]}")
        except DuplicateKey as exc:
            return Line(self._number, text, error=f"line {self._number}: {exc}: {text[:120]}")
        if isinstance(value, dict):
            self.step_lines += 1
            return Line(self._number, text, steps=(value,))
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            self.step_lines += 1
            return Line(self._number, text, steps=tuple(value))
        return Line(self._number, text, error=f"line {self._number} is not a step object: {text[:120]}")
