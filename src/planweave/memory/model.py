"""Memory entries (lessons and skills) and what can be checked of them without I/O (pure)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from planweave.core.errors import PlanweaveError

__all__ = ["ENTRY_KINDS", "ENTRY_STATUSES", "Candidate", "EntryKind", "EntryStatus", "MemoryEntry", "MemoryStoreError",
           "UnknownEntry", "instantiate", "parse_candidates"]

EntryKind = Literal["lesson", "skill"]
EntryStatus = Literal["candidate", "admitted", "rejected", "retired"]
ENTRY_KINDS: tuple[str, ...] = get_args(EntryKind)
ENTRY_STATUSES: tuple[str, ...] = get_args(EntryStatus)

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


class MemoryStoreError(PlanweaveError):
    """A memory entry or candidate that cannot be stored, found or used; the message names it."""


class UnknownEntry(MemoryStoreError):
    """No memory entry has the id asked for."""


def unknown(entry_id: int, url: str) -> UnknownEntry:
    return UnknownEntry(f"no memory entry {entry_id} in {url} (planweave memory list shows the ids)")


@dataclass(frozen=True)
class Candidate:
    """An entry proposed by distillation (or by hand): not yet stored, not yet verified.

    A skill carries ``steps`` (plan steps whose string arguments may hold ``${param}`` placeholders) and the
    ``params`` it was recorded with; a lesson may carry a ``check`` (one plan step that must succeed).
    """

    kind: EntryKind
    name: str
    text: str
    steps: tuple[Mapping[str, Any], ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    check: Mapping[str, Any] | None = None
    run_id: str | None = None
    step_ids: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()  # the hosts its source run used (goal, step arguments): what it may name

    def body(self) -> dict[str, Any]:
        """The parts stored as one JSON column (steps, params, check, the source run's hosts)."""
        return {"steps": [dict(s) for s in self.steps], "params": dict(self.params), "check": self.check,
                "hosts": list(self.hosts)}


@dataclass(frozen=True)
class MemoryEntry:
    """A stored entry: a candidate with its id, version, status, use count and when it was written."""

    id: int
    kind: EntryKind
    name: str
    text: str
    version: int
    status: EntryStatus
    uses: int
    created_at: float
    steps: tuple[Mapping[str, Any], ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    check: Mapping[str, Any] | None = None
    run_id: str | None = None
    step_ids: tuple[str, ...] = ()
    note: str = ""  # why it was admitted, rejected or retired
    hosts: tuple[str, ...] = ()  # the hosts its source run used: the only ones it may name (memory/screen.py)

    def with_status(self, status: EntryStatus, note: str) -> MemoryEntry:
        return replace(self, status=status, note=note)

    def body(self) -> dict[str, Any]:
        """The parts of the entry stored as one JSON column (steps, params, check, the source run's hosts)."""
        return {"steps": [dict(s) for s in self.steps], "params": dict(self.params), "check": self.check,
                "hosts": list(self.hosts)}

    def to_json(self) -> dict[str, Any]:
        """The entry as ``memory show --json`` and ``memory export`` print it."""
        return {"id": self.id, "kind": self.kind, "name": self.name, "version": self.version, "status": self.status,
                "text": self.text, "uses": self.uses, "created_at": self.created_at, **self.body(),
                "provenance": {"run_id": self.run_id, "step_ids": list(self.step_ids)}, "note": self.note}

    def search_text(self) -> str:
        """What retrieval ranks the entry by: its name, text and the tools of its steps."""
        tools = " ".join(str(s.get("tool", "")) for s in (*self.steps, *([self.check] if self.check else [])))
        return f"{self.name.replace('-', ' ').replace('_', ' ')} {self.text} {tools}"


def entry_from_row(row: Sequence[Any]) -> MemoryEntry:
    """A stored row (id, kind, name, version, status, text, body, run_id, step_ids, uses, created_at, note)."""
    entry_id, kind, name, version, status, text, body, run_id, step_ids, uses, created_at, note = row
    parts = json.loads(body) if isinstance(body, str) else body
    ids = json.loads(step_ids) if isinstance(step_ids, str) else step_ids
    return MemoryEntry(int(entry_id), kind, name, text, int(version), status, int(uses), float(created_at),
                       tuple(parts.get("steps") or ()), dict(parts.get("params") or {}), parts.get("check"),
                       run_id, tuple(ids or ()), note or "", tuple(parts.get("hosts") or ()))


def checked(candidate: Candidate) -> Candidate:
    """``candidate`` if it can be stored; raises MemoryStoreError naming the field otherwise."""
    where = f"memory candidate '{candidate.name}'"
    if candidate.kind not in ENTRY_KINDS:
        raise MemoryStoreError(f"{where}: kind '{candidate.kind}' is not one of {', '.join(ENTRY_KINDS)}")
    if not _NAME.match(candidate.name):
        raise MemoryStoreError(f"{where}: name must be 1-80 letters, digits, '.', '_' or '-'")
    if not candidate.text.strip():
        raise MemoryStoreError(f"{where}: text is empty")
    if candidate.kind == "skill":
        if not candidate.steps:
            raise MemoryStoreError(f"{where}: a skill needs steps (its sub-plan)")
        ids = {str(s.get("id")) for s in candidate.steps}
        clash = sorted(ids & set(candidate.params))
        if clash:
            raise MemoryStoreError(f"{where}: parameter '{clash[0]}' has the name of one of its steps")
        missing = sorted(_placeholders(candidate.steps) - ids - set(candidate.params))
        if missing:
            raise MemoryStoreError(f"{where}: placeholder '${{{missing[0]}}}' is neither a parameter nor a step")
    if candidate.check is not None and not isinstance(candidate.check, Mapping):
        raise MemoryStoreError(f"{where}: check must be one plan step (an object)")
    return candidate


def _placeholders(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m.group(1).split(".")[0] for m in _PLACEHOLDER.finditer(value)}
    if isinstance(value, Mapping):
        return set().union(*(_placeholders(v) for v in value.values())) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_placeholders(v) for v in value)) if value else set()
    return set()


def instantiate(steps: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The skill's steps with each ``${param}`` replaced by its value (a whole-string placeholder by the value
    itself, one inside text by its text); ``${step...}`` references to other steps are left for the engine."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            whole = _PLACEHOLDER.fullmatch(value)
            if whole and whole.group(1) in params:
                return params[whole.group(1)]
            return _PLACEHOLDER.sub(lambda m: str(params[m.group(1)]) if m.group(1) in params else m.group(0), value)
        if isinstance(value, Mapping):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return [fill(dict(step)) for step in steps]


def parse_candidates(text: str, *, run_id: str | None = None) -> tuple[list[Candidate], list[str]]:
    """Candidates from a distillation reply (JSON Lines, one entry per line) and the problems of the lines refused.

    A line: ``{"kind": "lesson", "name": ..., "text": ..., "check": {step}?, "steps_used": [ids]?}`` or
    ``{"kind": "skill", "name": ..., "text": ..., "steps": [steps with ${param}], "params": {...},
    "steps_used": [ids]?}``. Prose, code fences and blank lines are skipped.
    """
    found: list[Candidate] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON ({exc.msg})")
            continue
        try:
            steps = obj.get("steps") or []
            check = obj.get("check")
            used = obj.get("steps_used") or [s.get("id") for s in steps if isinstance(s, Mapping)]
            found.append(checked(Candidate(
                kind=obj.get("kind", ""), name=str(obj.get("name", "")), text=str(obj.get("text", "")),
                steps=tuple(steps) if isinstance(steps, list) else (), params=dict(obj.get("params") or {}),
                check=check, run_id=run_id, step_ids=tuple(str(s) for s in used if s))))
        except (MemoryStoreError, AttributeError, TypeError, ValueError) as exc:
            problems.append(f"line {number}: {exc}")
    return found, problems
