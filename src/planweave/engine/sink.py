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

from planweave.core.errors import StepFailed
from planweave.core.events import Event
from planweave.core.plan.model import Claim
from planweave.core.state import StepRecord
from planweave.engine import attempt as _attempt
from planweave.engine.attempts import Attempts
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost
from planweave.engine.people import People


class RunSink:
    """The step sink of one run's attempts."""

    def __init__(self, host: RunHost, emission: Emission, attempts: Attempts, people: People) -> None:
        self._journal = host.journal
        self._host = host
        self._attempts = attempts
        self._changes: Any = None  # the run's PlanChanges, built on a step's first tool call
        self._lent: dict[str, int] = {}  # steps that lent their slot while they wait: calls they wait on
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

    # -- tool calls a step makes as steps of their own (ToolCallSink: the llm tool's native tool calls) ----------
    def step_tool(self, name: str) -> tuple[str, Mapping[str, Any]] | None:
        tool = self._attempts.tools.get(name)
        return None if tool is None else (tool.description, tool.input_schema)

    async def step_call(self, step_id: str, child: Mapping[str, Any]) -> Any:
        """Add step ``child`` unless the run has it (a resumed caller making the same call finds it, finished or
        not), then wait for its end with ``step_id``'s concurrency slot lent to the run (so a run of concurrency 1
        can run the child), taking a slot again by its rank before returning the output."""
        sid = str(child["id"])
        state = self._emission.state
        if sid not in state.records:
            if self._changes is None:
                from planweave.engine.changes import PlanChanges

                a = self._attempts
                self._changes = PlanChanges(a.run_id, self._host, a.tools, self._emission, a._life, a)
            self._changes.extend([child], None, {"trigger": "tool_call", "caller": step_id})
        rec = state.records[sid]
        if rec.status == "succeeded":
            return self._attempts.outputs[sid]
        if rec.status in ("cancelled", "skipped") or (rec.status == "failed" and rec.retry_at is None):
            raise StepFailed(sid, rec.error or rec.status)
        ended: asyncio.Future[None] = self._loop.create_future()

        def watch(event: Event) -> None:
            if event.step != sid or ended.done():
                return
            if event.kind in ("step_succeeded", "step_cancelled", "step_skipped") or (
                    event.kind == "step_failed" and event.data.get("final")):
                ended.set_result(None)

        listeners = self._emission.listeners
        listeners.append(watch)
        lent = self._lend_slot(step_id)
        try:
            await ended
        finally:
            listeners.remove(watch)
            if lent:
                self._lent[step_id] -= 1
                if not self._lent[step_id]:  # the last call it waited on: take a slot again
                    del self._lent[step_id]
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():  # ending: the slot its attempt's end gives back
                        self._host.dispatch.scheduler.running += 1
                    else:
                        await self._take_slot(step_id)
        status: str = rec.status  # changed by the events awaited
        if status == "succeeded":
            return self._attempts.outputs[sid]
        raise StepFailed(sid, rec.error or status)

    def _lend_slot(self, step_id: str) -> bool:
        """Give ``step_id``'s concurrency slot (not its claims) to the run's other steps while it waits."""
        task = self._attempts.tasks.get(step_id)
        if task is None or task.done():
            return False  # not the step's real attempt (a speculative one holds a spare slot): nothing to lend
        self._lent[step_id] = self._lent.get(step_id, 0) + 1
        if self._lent[step_id] == 1:  # parallel calls of one step lend its one slot once
            self._host.dispatch.release(None)
        return True

    async def _take_slot(self, step_id: str) -> None:
        """Take a concurrency slot again for ``step_id``, queued by its rank like a ready step; cancelled meanwhile,
        it takes the slot at once (its attempt's end gives it back right after)."""
        dispatch = self._host.dispatch
        if dispatch.scheduler.try_start_now(None):
            return
        ticket = _SlotTicket(self._emission.state, self._loop.create_future(), dispatch.release)
        rank = self._emission.state.plan.rank.get(step_id, 0.0)
        dispatch.scheduler.push((ticket, ticket.record(step_id)), rank=rank, ready_at=self._loop.time())
        dispatch.pump()
        try:
            await asyncio.shield(ticket.granted)
        except asyncio.CancelledError:
            if not ticket.granted.done():
                ticket.granted.cancel()  # its admission, if it comes, gives that slot back
                dispatch.scheduler.running += 1  # the attempt's end releases one slot: the one it is owed
            raise

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


class _SlotTicket:
    """A queued request for a concurrency slot by a step that lent its slot while it waited (:meth:`RunSink.
    step_call`): the dispatcher "launches" it by granting the slot."""

    def __init__(self, state: Any, granted: asyncio.Future[None], give_back: Callable[[Claim | None], None]) -> None:
        self.state = state
        self.granted = granted
        self._give_back = give_back

    def record(self, step_id: str) -> StepRecord:
        rec: StepRecord = self.state.records[step_id]
        return rec

    def launch(self, rec: StepRecord, claims: Claim | None) -> None:
        if self.granted.done():  # the waiting step was cancelled meanwhile: the slot is not wanted
            self._give_back(claims)
        else:
            self.granted.set_result(None)
