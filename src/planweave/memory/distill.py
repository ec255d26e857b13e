"""Distillation: after a goal run ends, one model call turns what the run did into candidate lessons and skills.

The model sees the goal, the outcome and the finished steps (tool, arguments, a cut output) and answers JSON Lines
(:func:`planweave.memory.model.parse_candidates`). The candidates are stored with the run's provenance; nothing is
admitted here: :mod:`planweave.memory.verify` does that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planweave.engine.runtime import RunResult
from planweave.engine.state import RunState
from planweave.memory.model import Candidate, MemoryEntry, parse_candidates
from planweave.memory.store import MemoryStore
from planweave.models import ModelClient
from planweave.models.base import CompletionRequest, Message

__all__ = ["DISTILL_SYSTEM", "Distilled", "FinishedRun", "distill", "distill_prompt"]

DISTILL_SYSTEM = """You distil what an agent run learned into memory for later runs. Answer JSON Lines only, one
entry per line, at most 5 lines:
{"kind": "skill", "name": "<slug>", "text": "<when to use it>", "steps": [<plan steps, with "${param}" where a
later goal puts its own value>], "params": {"<param>": <the value this run used>}, "steps_used": ["<step ids>"]}
{"kind": "lesson", "name": "<slug>", "text": "<what worked or failed, a tool quirk>", "check": {<one plan step that
succeeds only if the lesson holds>}, "steps_used": ["<step ids>"]}
A skill is replayed with its params before it is kept; a lesson is kept once its check succeeds (or a person
approves it). Write [] if nothing is worth keeping."""


@dataclass(frozen=True)
class Distilled:
    """What one distillation stored (as candidates) and the reply lines it refused, with why."""

    entries: tuple[MemoryEntry, ...]
    problems: tuple[str, ...]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class FinishedRun:
    """What distillation reads of a run that ended: its id, status, error, state (steps) and outputs."""

    run_id: str
    status: str
    error: str | None
    state: RunState
    outputs: Mapping[str, Any]

    @classmethod
    def of(cls, result: RunResult) -> FinishedRun:
        return cls(result.run_id, result.status, result.error, result.state, result.outputs)


def distill_prompt(goal: str, result: RunResult | FinishedRun, *, max_chars: int = 6000) -> str:
    """The run as the distiller sees it: goal, outcome, each step with tool, arguments and a cut output."""
    lines = [f"Goal: {goal}", f"Outcome: {result.status}" + (f" ({result.error})" if result.error else ""), "Steps:"]
    per = max(80, max_chars // max(1, len(result.state.records)))
    for sid, rec in result.state.records.items():
        step = result.state.plan.steps[sid]
        out = json.dumps(result.outputs.get(sid), default=str)
        args = json.dumps(step.args, default=str, separators=(",", ":"))
        lines.append(f"- {sid} {step.tool} {args} -> {rec.status} {out[:per]}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[...cut]"


async def distill(client: ModelClient, store: MemoryStore, goal: str, result: RunResult | FinishedRun, *,
                  model: str | None = None, max_tokens: int = 1024) -> Distilled:
    """Ask ``client`` (``model`` if given, else its own) for candidates from ``result`` and store them."""
    messages = (Message("system", DISTILL_SYSTEM), Message("user", distill_prompt(goal, result)))
    completion = await client.complete(CompletionRequest(messages, model=model, max_tokens=max_tokens))
    candidates, problems = parse_candidates(completion.text, run_id=result.run_id)
    admitted = await store.entries(status="admitted")
    stored = []
    for candidate in candidates:
        if any(_same(candidate, entry) for entry in admitted):  # already known: no new version of the same thing
            problems.append(f"{candidate.kind} '{candidate.name}' is already admitted as it is: not stored again")
            continue
        stored.append(await store.add(_known_steps(candidate, result)))
    return Distilled(tuple(stored), tuple(problems), completion.prompt_tokens, completion.completion_tokens)


def _same(candidate: Candidate, entry: MemoryEntry) -> bool:
    """Whether ``candidate`` restates ``entry`` (kind, name, text, steps and check; the parameters may differ)."""
    return (candidate.kind, candidate.name, candidate.text, candidate.check) == (
        entry.kind, entry.name, entry.text, entry.check) and [dict(s) for s in candidate.steps] == [
        dict(s) for s in entry.steps]


def _known_steps(candidate: Candidate, result: RunResult | FinishedRun) -> Candidate:
    """``candidate`` with provenance only to steps the run has (a model may name others)."""
    known = tuple(s for s in candidate.step_ids if s in result.state.records)
    return Candidate(candidate.kind, candidate.name, candidate.text, candidate.steps, candidate.params,
                     candidate.check, candidate.run_id, known)
