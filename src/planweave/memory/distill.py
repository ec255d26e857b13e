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

from planweave.core.state import RunState
from planweave.engine.runtime import RunResult
from planweave.memory.model import Candidate, MemoryEntry, parse_candidates
from planweave.memory.screen import hosts_in
from planweave.memory.store import MemoryStore
from planweave.models import ModelClient
from planweave.models.base import CompletionRequest, Message

__all__ = ["DISTILL_SYSTEM", "Distilled", "FinishedRun", "distill", "distill_prompt", "used_hosts"]

DISTILL_SYSTEM = """You distil what an agent run learned into memory for later runs. Answer JSON Lines only, one
entry per line, at most 5 lines:
{"kind": "skill", "name": "<slug>", "text": "<when to use it>", "steps": [<plan steps, with "${param}" where a
later goal puts its own value>], "params": {"<param>": <the value this run used>}, "steps_used": ["<step ids>"]}
{"kind": "lesson", "name": "<slug>", "text": "<what worked or failed, a tool quirk>", "check": {"tool": "<tool>",
"args": {...}, "expect": {"path": "<key.path[0] into its output>", "equals": <the value it must have>}},
"steps_used": ["<step ids>"]}
A skill is replayed with its params before it is kept (only idempotent steps that wait for nobody are replayed); a
lesson is kept once its check's output meets its expect ("equals" or "contains"), or a person approves it. Write []
if nothing is worth keeping."""


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
    # Already known (admitted, or a candidate waiting for a person): no new version of the same thing.
    known = [*await store.entries(status="admitted"), *await store.entries(status="candidate")]
    stored = []
    hosts = used_hosts(goal, result)
    for candidate in candidates:
        same = next((entry for entry in known if _same(candidate, entry)), None)
        if same is not None:
            problems.append(f"{candidate.kind} '{candidate.name}' is already {same.status} as it is (memory "
                            f"{same.id}): not stored again")
            continue
        stored.append(await store.add(_known_steps(candidate, result, hosts)))
    return Distilled(tuple(stored), tuple(problems), completion.prompt_tokens, completion.completion_tokens)


def _same(candidate: Candidate, entry: MemoryEntry) -> bool:
    """Whether ``candidate`` restates ``entry`` (kind, name, text, steps and check; the parameters may differ)."""
    return (candidate.kind, candidate.name, candidate.text, candidate.check) == (
        entry.kind, entry.name, entry.text, entry.check) and [dict(s) for s in candidate.steps] == [
        dict(s) for s in entry.steps]


def used_hosts(goal: str, result: RunResult | FinishedRun) -> tuple[str, ...]:
    """The hosts the run used: named in its goal or its plan's step arguments (not in outputs: a page it read
    may name any host)."""
    steps = result.state.plan.steps.values()
    found = hosts_in([goal, *([s.args, s.fallback.args if s.fallback else {}] for s in steps)])
    return tuple(sorted(found))


def _known_steps(candidate: Candidate, result: RunResult | FinishedRun, hosts: tuple[str, ...]) -> Candidate:
    """``candidate`` with provenance only to steps the run has (a model may name others) and the hosts the run
    used (the only ones the entry may name: memory/screen.py)."""
    known = tuple(s for s in candidate.step_ids if s in result.state.records)
    return Candidate(candidate.kind, candidate.name, candidate.text, candidate.steps, candidate.params,
                     candidate.check, candidate.run_id, known, hosts)
