"""What a run's tools report while they run (a :class:`~planweave.core.context.StepSink` and
:class:`~planweave.core.context.ReservationSink`): usage, reservations, heartbeats, progress, a person's input, and
the loop-blocking warning. Callable from worker threads: each report is handed to the run's loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from planweave.engine import attempt as _attempt
from planweave.engine.attempts import Attempts
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost
from planweave.engine.people import People


class RunSink:
    """The step sink of one run's attempts."""

    def __init__(self, host: RunHost, emission: Emission, attempts: Attempts, people: People) -> None:
        self._journal = host.journal
        self._emission = emission
        self._emit = emission.emit
        self._watchdogs = attempts.watchdogs
        self._people = people
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self._in_loop(self._emit, "model_call", step_id, dict(usage))

    async def step_reserved(self, step_id: str, reservation: Mapping[str, Any]) -> None:
        """Journal a step's model call's reservation and wait until it is durable (ReservationSink; a tool on a
        worker thread's loop waits for the run's loop to write it)."""
        if threading.get_ident() == self._loop_thread:
            await self.record_reservation(reservation, step_id)
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self.record_reservation(reservation, step_id), self._loop))

    def step_released(self, step_id: str, release: Mapping[str, Any]) -> None:
        self._in_loop(self._emit, "model_released", step_id, dict(release))

    async def record_reservation(self, reservation: Mapping[str, Any], step: str | None = None) -> None:
        """Journal a ``model_reserved`` event (a budgeted call's id and worst case) and return once the journal holds
        it durably: a call journals this before its request goes out, so a process killed during the call leaves a
        reservation a resume counts as spent (docs/budgets.md, "Across crashes")."""
        self._emit("model_reserved", step, reservation)
        if self._journal.durable:
            await self._journal.flush()

    def step_heartbeat(self, step_id: str) -> None:
        self._in_loop(self._beat, step_id)

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self._in_loop(self._progress, step_id, fraction, message)

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        """Wait for a person to give step ``step_id`` a value (the ``human.input`` tool calls this)."""
        return await self._people.step_input(step_id, prompt, schema)

    def _beat(self, step_id: str) -> None:
        _attempt.beat(self._watchdogs, step_id, self._loop.time())

    def _progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self._beat(step_id)
        rec = self._emission.state.records.get(step_id)
        if rec is not None and rec.status == "running":
            self._emit("step_progress", step_id, {"fraction": fraction, "message": message})

    def warn_blocked(self, sid: str, data: Mapping[str, Any], since: float, finished: Callable[[], bool]) -> None:
        """Journal, once the loop turns again, that step ``sid``'s tool blocked it since ``since`` (any thread),
        unless the run has ``finished`` by then."""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._warn, sid, data, since, finished)

    def _warn(self, sid: str, data: Mapping[str, Any], since: float, finished: Callable[[], bool]) -> None:
        if not finished():
            blocked_s = time.monotonic() - since
            message = (f"tool '{data['tool']}' blocked the event loop for {blocked_s:.1f}s (in {data['where']}): "
                       "an async tool must not block, and its timeout cannot fire while it does")
            self._emission.record("warning", {**data, "message": message, "blocked_s": round(blocked_s, 3)}, sid)
