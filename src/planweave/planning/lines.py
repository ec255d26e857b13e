"""Reading a planner's streamed output: one JSON step object per line, parsed as each line completes (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Line:
    """One complete line of planner output: its number, text, and the step objects in it (or why there are none)."""

    number: int
    text: str
    steps: tuple[dict[str, Any], ...] = ()
    error: str | None = None


class LineParser:
    """Feed text chunks as they stream in; get back each complete non-empty line, parsed.

    JSON Lines is the contract: one step object per line (a JSON array of steps on one line is accepted too). Blank
    lines and Markdown code fences are skipped; anything else that is not a JSON object is reported as an error for
    the repair prompt, with its line number.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._number = 0

    def feed(self, text: str) -> list[Line]:
        self._buffer += text
        *complete, self._buffer = self._buffer.split("\n")
        return [line for raw in complete if (line := self._parse(raw)) is not None]

    def close(self) -> list[Line]:
        rest, self._buffer = self._buffer, ""
        line = self._parse(rest)
        return [line] if line is not None else []

    def _parse(self, raw: str) -> Line | None:
        self._number += 1
        text = raw.strip()
        if not text or text.startswith("```"):
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return Line(self._number, text, error=f"line {self._number} is not valid JSON ({exc.msg}): {text[:120]}")
        if isinstance(value, dict):
            return Line(self._number, text, steps=(value,))
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            return Line(self._number, text, steps=tuple(value))
        return Line(self._number, text, error=f"line {self._number} is not a step object: {text[:120]}")
