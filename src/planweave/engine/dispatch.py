"""Dispatch: the runtime side of the engine's :class:`~planweave.core.scheduler.Scheduler`, shared by its runs.

A run hands its ready steps to :meth:`Dispatcher.enqueue` and gives their slots back with
:meth:`Dispatcher.release`; the dispatcher calls :meth:`Launchable.launch` on the run when a step may start. The
scheduler decides; this drives it on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from planweave.core.plan.model import Claim, PlanSpec
from planweave.core.scheduler import Scheduler
from planweave.core.state import RunState, StepRecord


class Launchable(Protocol):
    """A run as the dispatcher sees it: its state, and a way to start one of its steps."""

    @property
    def state(self) -> RunState: ...

    def launch(self, rec: StepRecord, claims: Claim | None) -> None:
        """Start step ``rec``, which now holds a slot and ``claims`` (it gives them back with ``release``)."""
        ...


class Preemptible(Protocol):
    """A speculative attempt holding a spare slot (:meth:`Dispatcher.take_spare`)."""

    def preempt(self) -> None:
        """Stop at once: a real step needs the slot (the dispatcher has taken it back already)."""
        ...


class Dispatcher:
    """Admits the ready steps of every run of an engine in priority order within its concurrency and capacities."""

    def __init__(self, scheduler: Scheduler[tuple[Launchable, StepRecord]]) -> None:
        self.scheduler = scheduler
        self._pump_soon = False  # a deferred admission is scheduled (see release)
        self._spare: dict[Preemptible, Claim | None] = {}  # speculative attempts holding slots, oldest first

    @property
    def capacities(self) -> Mapping[str, int]:
        return self.scheduler.capacities

    def enqueue(self, run: Launchable, sid: str, now: float, batch: int = 1) -> None:
        """Queue a ready step, or start it at once when nothing limits it; ``batch`` counts it and the steps the
        same event made ready after it: the fast path is taken only when all of them fit, so priorities hold."""
        plan = run.state.plan
        claim = plan.claims[sid]
        if self.scheduler.try_start_now(claim, batch):
            run.launch(run.state.records[sid], None)  # nothing waits before it: no queue to order
            return
        self.scheduler.push((run, run.state.records[sid]), rank=plan.rank[sid], ready_at=now, claim=claim)

    def pump(self) -> None:
        """Start every queued step that fits now, best first."""
        for (run, rec), claims in self.scheduler.admit():
            run.launch(rec, claims)
        if self._spare and self.scheduler.has_waiting:
            self._preempt()

    # -- speculation: spare slots only, taken back the moment a real step needs one ---------------------------
    def take_spare(self, holder: Preemptible, claim: Claim | None) -> bool:
        """Give a speculative attempt a slot if nothing waits for one (it holds it until :meth:`give_back_spare`,
        :meth:`promote`, or a real step needs it and it is preempted)."""
        if self.scheduler.try_take_spare(claim):
            self._spare[holder] = claim
            return True
        return False

    def promote(self, holder: Preemptible) -> None:
        """The speculative attempt became its step's real attempt: it keeps its slot (given back by
        :meth:`release` with its claims) and is no longer preempted."""
        self._spare.pop(holder, None)

    def give_back_spare(self, holder: Preemptible) -> None:
        """A speculative attempt ended: its slot goes back (unless it was preempted or promoted)."""
        if holder in self._spare:
            self.release(self._spare.pop(holder))

    def _preempt(self) -> None:
        """Queued real steps wait: stop the newest speculative attempts whose slots they need, and admit again."""
        scheduler = self.scheduler
        while scheduler.has_waiting and self._spare:
            victim = next((h for h in reversed(self._spare) if scheduler.needs_back(self._spare[h])), None)
            if victim is None:
                return  # what the queue waits for is held by real steps
            scheduler.release(self._spare.pop(victim))
            victim.preempt()
            for (run, rec), claims in scheduler.admit():
                run.launch(rec, claims)

    def release(self, claims: Claim | None) -> None:
        """Give back a started step's slot and claims; queued steps are admitted on the next loop turn."""
        if self.scheduler.release(claims) and not self._pump_soon:  # items wait for a slot
            # One loop turn later, not now: steps that finish at the same instant (ties on a virtual clock, a burst
            # of completions) all release their slots and queue their successors first, so the freed slots go by
            # priority instead of to the successor of whichever step happened to finish first.
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._deferred_pump)

    def _deferred_pump(self) -> None:
        self._pump_soon = False
        self.pump()

    def withdraw(self, run: Launchable) -> None:
        """Drop every queued step of ``run`` (it was cancelled or stopped)."""
        self.scheduler.discard(lambda item: item[0] is not run)

    def adopt(self, spec: PlanSpec) -> None:
        """Add the capacities a plan declares that the engine does not know yet."""
        self.scheduler.adopt(spec.capacities)
