"""Offline planning: ``--model scripted:FILE`` answers the planning loop from a script file, no model and no key.

This is not a model. The planning loop runs exactly as with a real one — the plan streams line by line into
execution, failures are repaired, observations re-plan, the joiner answers — but each answer is read from FILE, a
YAML (or JSON) document (docs/offline.md):

.. code-block:: yaml

    ttft: 0.3                 # seconds before each answer's first token
    tokens_per_second: 40     # how fast answers stream (about 4 characters a token)
    plan:                     # the planner's first answer: these steps, one JSON line each
      - {id: paris, tool: forecast, args: {city: Paris}}
    replans:                  # the answers to successive re-plans (observations, the joiner's "replan")
      - [{id: more, tool: noop}]
    repairs:                  # a step that failed for good -> the steps that replace it
      paris: [{id: paris2, tool: forecast, args: {city: Paris}}]
    answer: "Rome is warmer." # the joiner's answer
    llm: "a short text"       # what an ``llm`` step gets

The script is served by :class:`~planweave.testing.scripted_llm.ScriptedLLM` on 127.0.0.1 and called through the
same OpenAI-compatible client as any endpoint, so what runs is the real client, stream parser and planning loop. Each
request is told apart by the planning loop's own prompts (:func:`purpose`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planweave.core.errors import PlanweaveError
from planweave.testing.scripted_dialects import Call
from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines

PREFIX = "scripted:"
"""``--model scripted:FILE``: the model name that selects a script."""

_KEYS = ("about", "ttft", "tokens_per_second", "plan", "replans", "repairs", "answer", "llm")


class ScriptError(PlanweaveError, ValueError):
    """A script file that cannot be used; the message names the file and the key."""


def purpose(request: RecordedRequest) -> str:
    """What the planning loop asks in ``request``, from its last message: ``join``, ``replan``, ``repair``,
    ``continue``, ``fix_lines``, ``plan`` or ``llm`` (anything else: an ``llm`` step's call)."""
    last = str(request.messages[-1].get("content", "")) if request.messages else ""
    if "If the results answer the goal" in last:
        return "join"
    if "Why a new plan is needed" in last:
        return "replan"
    if "failed for good" in last and "Write only the replacement steps" in last:
        return "repair"
    if "was cut off" in last:
        return "continue"
    if "lines of your plan were rejected" in last:
        return "fix_lines"
    if last.rstrip().endswith("Write the plan."):
        return "plan"
    return "llm"


def _steps(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise ScriptError(f"{where}: expected a list of steps (mappings with id and tool)")
    return [dict(s) for s in value]


@dataclass
class ScriptedPlanner:
    """A script's answers, and how far through its re-plans it is."""

    plan: list[dict[str, Any]]
    replans: list[list[dict[str, Any]]] = field(default_factory=list)
    repairs: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    answer: str = "done"
    llm: str = "ok"
    ttft: float = 0.0
    tokens_per_second: float | None = None
    source: str = ""
    _replans_given: int = 0

    @classmethod
    def load(cls, path: str | Path) -> ScriptedPlanner:
        """Read a script file; raises :class:`ScriptError` naming the file and what is wrong."""
        import yaml

        where = str(path)
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ScriptError(f"{where}: cannot read the script: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ScriptError(f"{where}: not YAML or JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ScriptError(f"{where}: a script is a mapping with plan, replans, repairs, answer, llm")
        unknown = sorted(set(doc) - set(_KEYS))
        if unknown:
            raise ScriptError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
        if "plan" not in doc:
            raise ScriptError(f"{where}: needs 'plan', the planner's first answer (a list of steps)")
        replans = doc.get("replans") or []
        repairs = doc.get("repairs") or {}
        if not isinstance(replans, list):
            raise ScriptError(f"{where}: replans: expected a list of plans (each a list of steps)")
        if not isinstance(repairs, dict):
            raise ScriptError(f"{where}: repairs: expected a mapping of step id to its replacement steps")
        tps = doc.get("tokens_per_second")
        ttft = doc.get("ttft", 0.0)
        if not isinstance(ttft, int | float) or ttft < 0 or (tps is not None and (
                not isinstance(tps, int | float) or tps <= 0)):
            raise ScriptError(f"{where}: ttft must be seconds >= 0 and tokens_per_second a number > 0")
        return cls(
            plan=_steps(doc["plan"], f"{where}: plan"),
            replans=[_steps(p, f"{where}: replans[{i}]") for i, p in enumerate(replans)],
            repairs={str(k): _steps(v, f"{where}: repairs.{k}") for k, v in repairs.items()},
            answer=str(doc.get("answer", "done")), llm=str(doc.get("llm", "ok")),
            ttft=float(ttft), tokens_per_second=None if tps is None else float(tps), source=where,
        )

    def reply(self, request: RecordedRequest) -> Reply:
        """The script's answer to one request of the planning loop."""
        asked = purpose(request)
        if asked == "plan":
            return self._lines(self.plan, request)
        if asked == "continue":  # the run was killed while the plan streamed: the steps it had not written yet
            written = " ".join(str(m.get("content", "")) for m in request.messages if m.get("role") == "assistant")
            return self._lines([s for s in self.plan if f'"id": "{s.get("id")}"' not in written
                                and f'"id":"{s.get("id")}"' not in written], request)
        if asked == "replan":
            if self._replans_given < len(self.replans):
                self._replans_given += 1
                return self._lines(self.replans[self._replans_given - 1], request)
            return self._lines([])
        if asked == "repair":
            last = str(request.messages[-1].get("content", ""))
            for sid, steps in self.repairs.items():
                if f"Step '{sid}' failed for good" in last:
                    return self._lines(steps, request)
            return self._lines([])
        if asked == "fix_lines":
            return self._lines([])
        if asked == "join":
            return Text(json.dumps({"answer": self.answer}), ttft=self.ttft)
        return Text(self.llm, ttft=self.ttft, tokens_per_second=self.tokens_per_second)

    def _lines(self, steps: Sequence[Mapping[str, Any]], request: RecordedRequest | None = None) -> Text:
        if steps and request is not None and offers_add_step(request):  # tool-call planning: one call per step
            return Text("", tool_calls=step_calls(steps), ttft=self.ttft, tokens_per_second=self.tokens_per_second)
        return Text(plan_lines(steps) if steps else "[]\n", ttft=self.ttft, tokens_per_second=self.tokens_per_second)


def offers_add_step(request: RecordedRequest) -> bool:
    """Whether the planning loop offered ``request`` the ``add_step`` function (tool-call planning), in any dialect."""
    tools = request.body.get("tools") if isinstance(request.body, dict) else None
    return isinstance(tools, list) and '"add_step"' in json.dumps(tools)


def step_calls(steps: Sequence[Mapping[str, Any]], *, start: int = 0) -> tuple[Call, ...]:
    """``steps`` as the planner's ``add_step`` calls (ids ``call_<n>`` from ``start``)."""
    return tuple(Call(f"call_{start + i}", "add_step", json.dumps(dict(s), separators=(",", ":")))
                 for i, s in enumerate(steps))


def script_path(model: str) -> str | None:
    """The script file named by a ``scripted:FILE`` model name, else None."""
    return model[len(PREFIX):] if model.startswith(PREFIX) else None


__all__ = ["PREFIX", "ScriptError", "ScriptedPlanner", "offers_add_step", "purpose", "script_path", "step_calls"]
