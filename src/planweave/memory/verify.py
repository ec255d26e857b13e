"""Admission only after verification: a skill's sub-plan is replayed through the engine, a lesson's check step is
run and its output compared with what it expects; success admits the entry, failure rejects it (kept for audit,
never retrieved).

Verification never runs an effect nobody approved and never waits for anybody (:mod:`planweave.memory.screen`): an
entry that asks for a host its source run never used or for a secret, a skill calling a non-idempotent tool or
dropping an approval the source run had, is rejected without running anything; one whose steps wait for a person
(an approval, ``human.input``) or claim ``writes:``, and a lesson whose check cannot fail (or that has none), stay
candidates for a person (``planweave memory admit ID``). What is run is bounded in time on the engine's clock
(:class:`ReplayLimits`): a replay still running then is cancelled and the entry rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planweave.core.errors import PlanweaveError
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.state import RunState
from planweave.engine.runtime import Engine
from planweave.memory.model import MemoryEntry, MemoryStoreError, instantiate
from planweave.memory.screen import check_screen, content_screen, expectation_failure, replay_screen
from planweave.memory.store import MemoryStore

__all__ = ["REPLAY_SOURCE", "ReplayLimits", "admit_by_person", "person_reason", "verification_plan", "verify",
           "verify_all"]

REPLAY_SOURCE = "memory"  # run_created's source of a replay or a check run (planweave runs shows it)


@dataclass(frozen=True)
class ReplayLimits:
    """How long a replay or a check may run, in seconds of the engine's clock: ``factor`` times as long as its
    source run took, within ``floor`` and ``cap``; ``unknown`` when the source run is not in the journal."""

    factor: float = 4.0
    floor: float = 5.0
    cap: float = 300.0
    unknown: float = 60.0

    def seconds(self, source_seconds: float | None) -> float:
        if source_seconds is None:
            return self.unknown
        return min(self.cap, max(self.floor, self.factor * source_seconds))


@dataclass(frozen=True)
class SourceRun:
    """What verification reads of the run an entry came from: the tools it called behind an approval (tool ->
    step) and how long it took."""

    approved_tools: Mapping[str, str]
    seconds: float | None

    @classmethod
    def of(cls, state: RunState) -> SourceRun:
        approved: dict[str, str] = {}
        for sid, step in state.plan.steps.items():
            if step.approval:
                approved.setdefault(step.tool, sid)
                if step.fallback is not None:
                    approved.setdefault(step.fallback.tool, sid)
        took = (state.finished_at - state.created_at
                if state.finished_at is not None and state.created_at is not None else None)
        return cls(approved, took)


NO_SOURCE = SourceRun({}, None)


async def source_run(engine: Engine, run_id: str | None) -> SourceRun:
    """The source run ``run_id`` as the engine's journal has it; nothing known when it is not there."""
    if run_id is None:
        return NO_SOURCE
    events = await engine.journal.read(run_id)
    if not events:
        return NO_SOURCE
    try:
        return SourceRun.of(RunState.from_events(run_id, events))
    except PlanweaveError:
        return NO_SOURCE


def _check_step(check: Mapping[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in check.items() if k != "expect"}, "id": "check"}


def verification_plan(entry: MemoryEntry) -> dict[str, Any] | None:
    """The plan that verifies ``entry``: a skill's steps with its recorded parameters, a lesson's check step; None
    for a lesson without a check (a person admits it). No step of it reuses a cached output (a replay must run)."""
    if entry.kind == "skill":
        return {"steps": instantiate(entry.steps, entry.params), "cache": False}
    if entry.check is not None:
        return {"steps": [_check_step(entry.check)], "cache": False}
    return None


def person_reason(entry: MemoryEntry) -> str | None:
    """Why verification cannot decide ``entry`` without tools (so a person may admit it), or None: a lesson with no
    check or one that cannot fail, a step that waits for a person or claims ``writes:``."""
    if entry.kind == "lesson":
        if entry.check is None:
            return "a lesson without a check"
        cannot = check_screen(entry.check)
        if cannot is not None:
            return f"its check cannot fail: {cannot}"
    steps = instantiate(entry.steps, entry.params) if entry.kind == "skill" else (
        [_check_step(entry.check)] if entry.check is not None else [])
    screen = replay_screen(steps, {}, {})
    return screen.why if screen.verdict == "person" else None


def _leave(entry: MemoryEntry, why: str) -> str:
    return f"left for a person: {why}, so it is not run (planweave memory admit {entry.id} after reading it)"


async def verify(engine: Engine, store: MemoryStore, entry: MemoryEntry, *, tools: ToolCatalog | None = None,
                 limits: ReplayLimits = ReplayLimits()) -> MemoryEntry:
    """Verify a candidate ``entry`` on ``engine`` (with ``tools``, the engine's by default) and admit or reject it,
    or leave it a candidate with a note saying why a person must decide.

    Returns the entry as stored afterwards; a lesson without a check comes back unchanged (still a candidate).
    """
    if entry.status != "candidate":
        raise MemoryStoreError(f"memory entry {entry.id} is {entry.status}: only a candidate is verified")
    refused = content_screen(entry)
    if refused is not None:
        return await store.set_status(entry.id, "rejected", f"not run: {refused}")
    plan = verification_plan(entry)
    if plan is None:
        return entry
    if entry.kind == "lesson" and entry.check is not None:
        cannot = check_screen(entry.check)
        if cannot is not None:
            return await store.set_status(entry.id, "candidate", _leave(entry, f"its check cannot fail ({cannot})"))
    catalog = _catalog(engine, tools)
    source = await source_run(engine, entry.run_id)
    screen = replay_screen(plan["steps"], catalog, source.approved_tools)
    if screen.verdict == "refuse":
        return await store.set_status(entry.id, "rejected", f"not run: {screen.why}")
    if screen.verdict == "person":
        return await store.set_status(entry.id, "candidate", _leave(entry, screen.why))
    what = "replay" if entry.kind == "skill" else "check"
    try:
        run = await engine.start(plan, tools=catalog, source=REPLAY_SOURCE)
    except PlanweaveError as exc:  # an invalid sub-plan or check: it cannot be verified, so it is not admitted
        return await store.set_status(entry.id, "rejected", f"{what} could not start: {exc}")
    bound = limits.seconds(source.seconds)
    try:
        async with asyncio.timeout(bound):
            result = await run.wait()
    except TimeoutError:
        run.cancel(f"memory {what} of entry {entry.id} did not finish within {bound:g} s")
        with contextlib.suppress(TimeoutError):  # a cancelled run ends promptly; never wait on it unbounded
            async with asyncio.timeout(bound):
                await asyncio.gather(run.wait(), return_exceptions=True)
        return await store.set_status(entry.id, "rejected", f"{what} run {run.id} did not finish within {bound:g} s "
                                                             "(cancelled)")
    if not result.ok:
        return await store.set_status(entry.id, "rejected", f"{what} run {result.run_id} {result.status}: "
                                                             f"{result.error}")
    if entry.kind == "lesson" and entry.check is not None:
        failed = expectation_failure(entry.check["expect"], result.outputs.get("check"))
        if failed is not None:
            return await store.set_status(entry.id, "rejected", f"check run {result.run_id}: {failed}")
    return await store.set_status(entry.id, "admitted", f"{what} run {result.run_id} succeeded")


def _catalog(engine: Engine, tools: ToolCatalog | None) -> ToolCatalog:
    """The tools a replay runs with, known before it starts (the screen needs to see whether they are idempotent)."""
    if tools is not None:
        return tools
    if engine.tools is not None:
        return engine.tools
    from planweave.tools import builtin_tools

    return builtin_tools()


async def verify_all(engine: Engine, store: MemoryStore, entries: Sequence[MemoryEntry], *,
                     tools: ToolCatalog | None = None, limits: ReplayLimits = ReplayLimits()) -> list[MemoryEntry]:
    """:func:`verify` each entry in turn (replays share the engine; one at a time keeps their runs apart)."""
    return [await verify(engine, store, entry, tools=tools, limits=limits) for entry in entries]


async def admit_by_person(store: MemoryStore, entry_id: int, who: str = "a person") -> MemoryEntry:
    """Admit, on a person's word, a candidate verification cannot decide (:func:`person_reason`); anything else is
    refused, naming why."""
    entry = await store.get(entry_id)
    if entry.status != "candidate":
        raise MemoryStoreError(f"memory entry {entry_id} is {entry.status}: only a candidate can be admitted")
    refused = content_screen(entry)
    if refused is not None:
        raise MemoryStoreError(f"memory entry {entry_id} is never given to a planner: {refused}")
    if person_reason(entry) is None:
        if entry.kind == "skill":
            raise MemoryStoreError(f"memory entry {entry_id} is a skill: a skill is admitted only by replaying it "
                                   "(planweave memory verify)")
        raise MemoryStoreError(f"memory entry {entry_id} carries a check step: it is admitted only when the check "
                               "succeeds (planweave memory verify)")
    return await store.set_status(entry_id, "admitted", f"approved by {who}")
