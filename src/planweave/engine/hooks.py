"""The hooks speculative work drives a run through: a run's :class:`~planweave.engine.speculative.Speculator` (the
engine's speculation) and a draft planner's attempts (planning/draft.py). They start work in the run's TaskGroup, hold
the dispatcher's spare slots, journal ``speculation_*`` events and make an attempt the step's own (adopted); the
outcome of an adopted attempt is settled as any attempt's (:meth:`Attempts.settle`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from planweave.core.context import StepSink
from planweave.core.events import EventKind
from planweave.core.plan.model import Claim
from planweave.core.state import StepRecord
from planweave.engine import attempt as _attempt
from planweave.engine.attempts import Attempts
from planweave.engine.dispatch import Dispatcher
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost
from planweave.engine.lifecycle import Lifecycle


class SpeculationHooks:
    """What speculative work may do to one run (a :class:`~planweave.engine.speculative.SpeculativeRun`)."""

    def __init__(self, run_id: str, host: RunHost, emission: Emission, life: Lifecycle, attempts: Attempts,
                 sink: StepSink, outputs: dict[str, Any]) -> None:
        self.id = run_id
        self.state = emission.state
        self.outputs = outputs
        self.priority = attempts.priority
        self._host = host
        self._emit = emission.emit
        self._life = life
        self._attempts = attempts
        self._sink = sink

    @property
    def dispatcher(self) -> Dispatcher:
        """The engine's dispatcher: speculative work that is not a step of the plan yet (a draft planner's attempts,
        planning/draft.py) holds its spare slots (:meth:`Dispatcher.take_spare`)."""
        return self._host.dispatch

    def emit_speculation(self, kind: EventKind, sid: str, data: Mapping[str, Any]) -> None:
        """Journal a ``speculation_started``, ``_adopted`` or ``_discarded`` event of step ``sid``."""
        self._emit(kind, sid, data)

    def spawn(self, coro: Coroutine[Any, Any, None], sid: str) -> asyncio.Task[None] | None:
        """Start a speculative attempt of step ``sid`` in the run's TaskGroup (None when the run is ending)."""
        return self._life.spawn(coro, f"planweave-speculative-{self.id}-{sid}")

    async def call_tool(self, call: Any) -> Any:
        """Execute a speculative attempt's call as a step's (under its timeout and heartbeat)."""
        step = self.state.plan.steps[call.step_id]
        executor = self._host.executor
        if step.timeout is None and step.heartbeat is None:
            return await executor.execute(call)
        return await _attempt.guarded(executor, call, step, self._attempts.watchdogs)

    def adopt_finished(self, rec: StepRecord, started_at: float, output: Any,
                       args: Mapping[str, Any] | None = None, *, finished_at: float | None = None) -> None:
        """Ready step ``rec`` takes the output of its finished speculative attempt (started at ``started_at``, on
        ``args``, the real arguments; ended at ``finished_at``)."""
        attempt = rec.attempts + 1
        self._emit("step_started", rec.id, {"attempt": attempt})
        self._emit("speculation_adopted", rec.id, {"started_at": started_at,
                                                   **({} if finished_at is None else {"finished_at": finished_at})})
        self.settle_adopted(rec, attempt, None, output, None, slot=False, args=args)

    def adopt_running(self, rec: StepRecord, started_at: float, task: asyncio.Task[None]) -> int:
        """Ready step ``rec``'s running speculative attempt ``task`` becomes its attempt; return the number."""
        attempt = rec.attempts + 1
        self._emit("step_started", rec.id, {"attempt": attempt})
        self._emit("speculation_adopted", rec.id, {"started_at": started_at})
        self._attempts.tasks[rec.id] = task
        return attempt

    def settle_adopted(self, rec: StepRecord, attempt: int, claims: Claim | None, output: Any,
                       error: BaseException | None, *, slot: bool = True,
                       args: Mapping[str, Any] | None = None) -> None:
        """An adopted attempt ended with ``output`` or ``error``: settled as any attempt's outcome (indexed in the
        result cache as the step's own attempt on ``args`` would be), and its slot given back (``slot``: it held one
        of the dispatcher's)."""
        attempts = self._attempts
        try:
            entry = None
            if error is None and args is not None:
                entry = attempts.entry_of(rec, self.state.plan.steps[rec.id], args)
            attempts.settle(rec, attempt, output, error, entry=entry)
        finally:
            attempts.ended(rec, attempt, claims, slot=slot)

    # A StepSink's reports of speculative work (usage flagged speculative by the caller; heartbeats).
    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self._sink.step_usage(step_id, usage)

    def step_heartbeat(self, step_id: str) -> None:
        self._sink.step_heartbeat(step_id)
