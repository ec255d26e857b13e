"""Splicing a new plan version into a running one by state matching (pure: no I/O).

A re-planner returns the *remaining* plan, possibly referring to finished steps by id and possibly renaming steps.
:func:`merge_proposal` turns it into the next full plan version, matched against the run's state *when the proposal
arrives*: finished steps it refers to are carried over; a proposed step whose fingerprint equals an existing step's
takes that step's id (so a finished result is bound, not recomputed, and a running step is adopted); references to
steps that failed or were cancelled since the re-planner looked make the proposal stale, unless the proposal
restates them. A skipped step it refers to is carried over and runs again once what it waited for is replaced.
:func:`splice_diff` then says what the new version does to each step; the fold applies exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from planweave.core.errors import PlanError, PlanInvalid, PlanProblem
from planweave.core.plan.graph import Plan, validate_plan
from planweave.core.plan.model import PlanSpec, Step
from planweave.core.plan.refs import compile_args, rename_refs

_DEAD = ("failed", "cancelled", "skipped")


class StatusRecord(Protocol):
    """What splicing reads of a step's record: its status (``engine.state.StepRecord`` is one).

    A protocol rather than an import of ``engine.state``, which folds plan versions with :func:`splice_diff`: the
    dependency runs one way, state -> splice.
    """

    @property
    def status(self) -> str: ...


class StaleProposal(PlanError):
    """A proposed plan depends on steps that failed or were cancelled after the re-planner saw the state."""

    def __init__(self, message: str, steps: Sequence[str]) -> None:
        super().__init__(message)
        self.steps = tuple(steps)


@dataclass(frozen=True)
class SpliceDiff:
    """What a new plan version does to each step of the running one."""

    added: tuple[str, ...] = ()  # new work: new steps, changed steps, re-runs of failed ones
    kept: tuple[str, ...] = ()  # finished steps whose results the new version uses as they are
    adopted: tuple[str, ...] = ()  # running steps that keep running as part of the new version
    unchanged: tuple[str, ...] = ()  # waiting steps carried over as they were
    cancelled: tuple[str, ...] = ()  # running steps the new version no longer has (or has changed)
    dropped: tuple[str, ...] = ()  # waiting (or skipped) steps the new version no longer has (or has changed)

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(getattr(self, k)) for k in ("added", "kept", "adopted", "unchanged", "cancelled", "dropped")}


def _same(old: Plan, new: Plan, sid: str) -> bool:
    return sid in old.steps and old.fingerprints[sid] == new.fingerprints[sid]


def splice_diff(records: Mapping[str, StatusRecord], old: Plan, new: Plan) -> SpliceDiff:
    """Classify every step of ``old`` and ``new`` given the current step ``records`` of the old version."""
    added, kept, adopted, unchanged, cancelled, dropped = [], [], [], [], [], []
    for sid in new.order:
        rec = records.get(sid)
        if rec is not None and _same(old, new, sid) and rec.status not in (*_DEAD, "unknown"):
            if rec.status == "succeeded":
                kept.append(sid)
            elif rec.status == "running":
                adopted.append(sid)
            else:
                unchanged.append(sid)
            continue
        added.append(sid)
        if rec is not None and rec.status == "running":
            cancelled.append(sid)
        elif rec is not None and rec.status in ("pending", "ready"):
            dropped.append(sid)
    for sid, rec in records.items():
        if sid in new.steps:
            continue
        if rec.status == "running":
            cancelled.append(sid)
        elif rec.status in ("pending", "ready", "unknown", "skipped"):
            dropped.append(sid)
    return SpliceDiff(*(tuple(x) for x in (added, kept, adopted, unchanged, cancelled, dropped)))


def _referenced(step: Step) -> set[str]:
    found = {ref.step for value in step.args.values() for ref in compile_args(value)[1]}
    return found | set(step.after)


def merge_proposal(  # noqa: C901 (matching by fingerprint, every case commented)
    proposal: PlanSpec,
    old: Plan,
    records: Mapping[str, StatusRecord],
    *,
    source: str = "proposal",
) -> tuple[PlanSpec, dict[str, str]]:
    """Turn a proposed remaining plan into the next full plan spec; return it and the renames applied.

    Raises :class:`StaleProposal` if it depends on steps that are dead now, :class:`PlanInvalid` if it is invalid.
    """
    proposed = {s.id: s for s in proposal.steps}
    # 1. Carry over the old steps the proposal needs but does not restate (finished or still in flight).
    carried: dict[str, Step] = {}
    stale: list[str] = []
    problems: list[PlanProblem] = []
    queue = [ref for s in proposal.steps for ref in _referenced(s)]
    while queue:
        sid = queue.pop()
        if sid in proposed or sid in carried:
            continue
        rec = records.get(sid)
        if rec is None or sid not in old.steps:
            continue  # validation reports the unknown reference with a did-you-mean
        if rec.status in ("failed", "cancelled"):
            stale.append(sid)
            continue
        # A skipped step is carried (and revived) like a waiting one: only what it waits for decides. It is usable
        # when the proposal replaces the failed step it waited for, stale when that step stays dead.
        carried[sid] = old.steps[sid]
        queue.extend(old.deps[sid])
    if stale:
        names = ", ".join(f"'{s}' ({records[s].status})" for s in sorted(set(stale)))
        raise StaleProposal(f"{source} depends on step(s) that are no longer usable: {names}", sorted(set(stale)))
    # Finished steps always stay in the plan (their results are part of the run), needed or not.
    for sid in old.order:
        if sid not in proposed and sid not in carried and records[sid].status == "succeeded":
            carried[sid] = old.steps[sid]
    merged = old.spec.model_copy(
        update={"steps": (*[old.steps[s] for s in old.order if s in carried], *proposal.steps)}
    )
    try:
        first = validate_plan(merged, source=source)
    except PlanInvalid as exc:
        problems.extend(exc.problems)
        raise PlanInvalid(problems, source) from None
    # 2. Rename proposed steps onto existing steps with the same fingerprint (same work, same inputs).
    by_print: dict[str, str] = {}
    for sid in old.order:
        if records[sid].status in ("succeeded", "running", "pending", "ready"):
            by_print.setdefault(old.fingerprints[sid], sid)
    renames: dict[str, str] = {}
    for sid in first.order:
        if sid not in proposed:
            continue
        match = by_print.get(first.fingerprints[sid])
        if match is None or match == sid:
            continue
        if match in proposed or match in renames.values():
            continue  # the id is used by other proposed work: keep the step as new
        renames[sid] = match
    if not renames:
        return merged, {}
    steps: list[Step] = []
    for step in merged.steps:
        if step.id in carried and step.id in renames.values():
            continue  # the renamed proposed step replaces its carried twin
        new_id = renames.get(step.id, step.id)
        steps.append(step.model_copy(update={
            "id": new_id,
            "args": rename_refs(step.args, renames),
            "after": tuple(renames.get(a, a) for a in step.after),
        }))
    return merged.model_copy(update={"steps": tuple(steps)}), renames
