"""Reading a planner's plan from native tool calls: one ``add_step`` call per step, each parsed the moment its
streamed arguments complete (pure: no I/O).

The planner is offered a function ``add_step`` whose arguments are one step object (its JSON schema is the plan
model's :class:`~planweave.core.plan.model.Step`, trimmed to the keys a planner writes) and, with the references
context, ``write_report`` (``{"report": "..."}``, the run's notes). A provider streams each call's arguments in
pieces (:class:`~planweave.models.ToolCallDelta`); :class:`StepCalls` follows the JSON nesting of each call's pieces
and hands back the call as a :class:`~planweave.planning.lines.Line` as soon as its top-level object closes, so the
step is admitted into the run while the model still writes the next one, exactly as a JSON line is in text mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planweave.core.plan.document import DuplicateKey, unique_keys
from planweave.core.plan.model import Step
from planweave.models import ToolCall, ToolCallDelta, ToolSpec
from planweave.planning.lines import Line

ADD_STEP = "add_step"
WRITE_REPORT = "write_report"
# The keys of Step named in add_step's schema: the ones most steps use. The rarer ones (retries, estimate, fallback,
# verifies, ...) are described by the prompt's format and pass through ``additionalProperties`` to the plan's own
# validator; naming them all would send ~1,000 more prompt tokens with every planner call.
_STEP_KEYS = ("id", "tool", "args", "after", "observe", "approval")


def _lean(schema: Any) -> Any:
    """``schema`` without pydantic's titles and defaults (tokens the model does not need)."""
    if isinstance(schema, dict):
        return {k: _lean(v) for k, v in schema.items() if k not in ("title", "default")}
    if isinstance(schema, list):
        return [_lean(v) for v in schema]
    return schema


def step_schema(tool_names: Iterable[str] = ()) -> dict[str, Any]:
    """The JSON schema of ``add_step``'s arguments: the plan model's step (its common keys), its ``tool`` one of
    ``tool_names`` (when given). Extra keys are allowed: the plan's own validator checks them, and says what is
    wrong, per call."""
    full = Step.model_json_schema()
    properties = {k: _lean(v) for k, v in full["properties"].items() if k in _STEP_KEYS}
    names = sorted(set(tool_names))
    if names:
        properties["tool"] = {**properties["tool"], "enum": names}
    return {"type": "object", "properties": properties, "required": ["id", "tool"], "additionalProperties": True}


def planner_tools(tool_names: Iterable[str], *, report: bool = False) -> tuple[ToolSpec, ...]:
    """The functions the planner is offered: ``add_step`` (and ``write_report`` with ``report``)."""
    add = ToolSpec(ADD_STEP, "Add one step to the plan. Call it once per step, in order: a step may only refer to "
                   "steps added before it. The step starts as soon as its inputs exist.", step_schema(tool_names))
    if not report:
        return (add,)
    notes = ToolSpec(WRITE_REPORT, "Replace the run's report: what was learned, what is left, ids that matter.",
                     {"type": "object", "properties": {"report": {"type": "string"}}, "required": ["report"]})
    return add, notes


@dataclass
class _Arguments:
    """One call's arguments so far, and where its JSON nesting stands (to see the top-level object close)."""

    number: int
    name: str = ""
    text: str = ""
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    opened: bool = False
    done: bool = False

    def feed(self, piece: str) -> bool:
        """Add a piece; True when it closed the top-level JSON object (the arguments are complete)."""
        self.text += piece
        for char in piece:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
                self.opened = True
            elif char in "}]":
                self.depth -= 1
                if self.opened and self.depth == 0:
                    return True
        return False


@dataclass
class StepCalls:
    """Feed streamed tool-call pieces; get back each call whose arguments completed, parsed as a :class:`Line`.

    Numbers count the calls of the reply from 1 (``call 2``), as lines count lines in text mode. A call to another
    function, arguments that are not a JSON object, or arguments left unfinished at the end are errors for the
    repair prompt. :attr:`step_calls` counts the calls that held a step or a report.
    """

    _calls: dict[int, _Arguments] = field(default_factory=dict)
    step_calls: int = 0

    def feed(self, delta: ToolCallDelta) -> list[Line]:
        call = self._calls.get(delta.index)
        if call is None:
            call = self._calls[delta.index] = _Arguments(len(self._calls) + 1)
        if delta.name:
            call.name = delta.name
        if call.done or not call.feed(delta.arguments):
            return []
        call.done = True
        return [self._parse(call)]

    def close(self, calls: Sequence[ToolCall] = ()) -> list[Line]:
        """The end of the reply: calls never streamed as pieces (``calls``, the completion's, beyond those seen)
        and calls whose arguments never closed are parsed now."""
        out = []
        for position, whole in enumerate(calls):
            if position >= len(self._calls):
                self._calls[-1 - position] = _Arguments(len(self._calls) + 1, whole.name, whole.arguments)
        for call in self._calls.values():
            if not call.done:
                call.done = True
                out.append(self._parse(call))
        return out

    def _parse(self, call: _Arguments) -> Line:
        where = f"{call.name or 'tool'} call {call.number}"
        text = call.text.strip() or "{}"
        if call.name not in (ADD_STEP, WRITE_REPORT):
            return Line(call.number, text, error=f"{where}: unknown function '{call.name}' (call {ADD_STEP} once per "
                                                 "step)")
        try:
            value = json.loads(text, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as exc:
            return Line(call.number, text, error=f"{where}: arguments are not valid JSON ({exc.msg}): {text[:120]}")
        except DuplicateKey as exc:
            return Line(call.number, text, error=f"{where}: {exc}: {text[:120]}")
        if not isinstance(value, Mapping):
            return Line(call.number, text, error=f"{where}: arguments are not a JSON object: {text[:120]}")
        self.step_calls += 1
        if call.name == WRITE_REPORT:
            return Line(call.number, text, steps=({"report": str(value.get("report", ""))},), kind=f"{call.name} call")
        return Line(call.number, text, steps=(dict(value),), kind=f"{call.name} call")


def calls_as_lines(calls: Iterable[ToolCall]) -> str:
    """A reply's tool calls as the planner's own answer in a later message (a chat message here carries text only):
    one ``add_step {...}`` line per call."""
    return "\n".join(f"{c.name} {c.arguments.strip()}" for c in calls)
