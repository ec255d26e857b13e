"""The people in a run: approvals (a step waiting until a person approves or rejects it, under its deadline),
inputs (``human.input`` waiting for a value), and replies journaled by another process. The first reply is final."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from planweave.core.errors import InputRejected, RunError, did_you_mean
from planweave.core.events import Event, EventKind
from planweave.core.plan.refs import render_text
from planweave.core.replies import refusal
from planweave.core.state import StepRecord
from planweave.engine.attempts import Attempts
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost
from planweave.engine.lifecycle import Lifecycle


def check_value(schema: Mapping[str, Any] | None, value: Any, run_id: str, step: str) -> None:
    """Raise :class:`InputRejected` naming the reason if ``value`` does not satisfy the JSON ``schema``."""
    if schema is None:
        return
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        at = f" at '{where}'" if where else ""
        raise InputRejected(f"run '{run_id}', step '{step}': the value is refused{at}: {error.message}")


def _given(data: dict[str, Any], by: str | None, reply: int | None) -> dict[str, Any]:
    """An ``approval_given``/``input_given`` payload with who answered and the position of the journaled
    ``step_reply`` it applies, when there are (an anonymous in-process answer has neither: the payload stays as
    older journals hold it)."""
    if by is not None:
        data["by"] = by
    if reply is not None:
        data["reply"] = reply
    return data


class People:
    """Approvals, inputs and replies of one run."""

    def __init__(self, run_id: str, host: RunHost, emission: Emission, life: Lifecycle, attempts: Attempts,
                 outputs: dict[str, Any]) -> None:
        self.run_id = run_id
        self.state = emission.state
        self._redact = host.redact
        self._emission = emission
        self._life = life
        self._attempts = attempts
        self._outputs = outputs
        self._pump = host.dispatch.pump
        self._loop = asyncio.get_running_loop()
        self._inputs: dict[str, asyncio.Future[Any]] = {}  # human.input calls waiting for a value
        self._answers: dict[str, Event] = {}  # step -> the reply this run applied to its last wait (it stands)
        self._replies_taken: set[int] = set()  # positions of the journaled replies already applied or refused

    def decide(self, step: str, approve: bool, reason: str | None, by: str | None, reply: int | None) -> None:
        """Approve or reject step ``step``'s request (see :meth:`planweave.engine.runtime.Run.approve`)."""
        rec = self._waiting(step, "waiting_approval", "an approval")
        self._attempts.disarm(step)
        self._answered(step, "approval_given", _given({"approve": approve, "reason": reason}, by, reply))
        if approve:
            self._pump()
            return
        message = f"rejected: {reason}" if reason else "rejected"
        if self._redact is not None:
            message = self._redact(message)
        self._attempts.give_up(rec, self.state.plan.steps[step], rec.attempts, "rejected", message)
        self._pump()
        self._life.check_done()

    def give(self, step: str, value: Any, by: str | None, reply: int | None) -> None:
        """Give ``value`` to step ``step`` waiting for input (see :meth:`planweave.engine.runtime.Run.send`)."""
        rec = self._waiting(step, "waiting_input", "a value")
        check_value(rec.input_schema, value, self.run_id, step)
        self._answered(step, "input_given", _given({"value": value}, by, reply))
        waiter = self._inputs.pop(step, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _answered(self, step: str, kind: EventKind, data: Mapping[str, Any]) -> None:
        """Emit the decision for ``step``'s wait, and remember it: a later reply is refused naming it."""
        self._emission.emit(kind, step, data)
        self._answers[step] = Event(self.run_id, kind, self._emission.now(), step, data)

    def apply_reply(self, step: str, reply: Mapping[str, Any], pos: int | None = None) -> bool:
        """Apply a ``step_reply`` another process journaled at ``pos`` ({approve, reason, by} or {value, by}); False
        if it does not apply (a reply applied first stands, the step stopped waiting, or the value fails the
        schema). Each journaled reply is taken once, whichever path (the control watcher, a resume, this process's
        HTTP route) brings it first."""
        if pos is not None:
            if pos in self._replies_taken:
                return False
            self._replies_taken.add(pos)
        by = reply.get("by")
        try:
            if "value" in reply:
                self.give(step, reply["value"], by, pos)
            else:
                self.decide(step, bool(reply.get("approve")), reply.get("reason"), by, pos)
        except (RunError, InputRejected):
            return False
        return True

    def _waiting(self, sid: str, status: str, what: str) -> StepRecord:
        rec = self.state.records.get(sid)
        answer = self._answers.get(sid)
        if answer is not None and rec is not None and rec.status != status:
            raise refusal(self.run_id, sid, answer)  # also once the run ended (a rejection ends most)
        if self._life.finished or self._life.tg is None:
            raise RunError(f"run '{self.run_id}' is not running")
        if rec is None:
            raise RunError(f"run '{self.run_id}' has no step '{sid}'{did_you_mean(sid, self.state.records)}")
        if rec.status != status:
            raise RunError(f"step '{sid}' of run '{self.run_id}' is not waiting for {what} (it is {rec.status})")
        return rec

    def request_approval(self, sid: str) -> None:
        """Ask for step ``sid``'s approval (it became ready) and arm its deadline."""
        approval = self.state.plan.steps[sid].approval
        # The question as the approver must read it: its references rendered on the outputs there are now (the
        # values redacted as an error text is: an output's secret stays out of the journal).
        prompt = render_text(approval, self._outputs) if isinstance(approval, str) else None
        if prompt is not None and prompt != approval and self._redact is not None:
            prompt = self._redact(prompt)
        self._emission.emit("approval_requested", sid, {"prompt": prompt})
        self._arm_deadline(self.state.records[sid])

    def _arm_deadline(self, rec: StepRecord) -> None:
        """Bound an approval wait by the step's ``timeout``, counted from the request (also across a resume)."""
        timeout = self.state.plan.steps[rec.id].timeout
        if timeout is not None and self._life.tg is not None:
            now = self._emission.now
            since = rec.waiting_since if rec.waiting_since is not None else now()
            self._attempts.arm(rec.id, self._approval_deadline(rec, since + timeout - now(), timeout))

    async def _approval_deadline(self, rec: StepRecord, delay: float, timeout: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        self._attempts.timers.pop(rec.id, None)
        if self.state.records.get(rec.id) is rec and rec.status == "waiting_approval":
            self._attempts.give_up(rec, self.state.plan.steps[rec.id], rec.attempts, "timeout",
                                   f"no approval within {timeout:g}s")
            self._pump()
            self._life.check_done()

    def rewait(self) -> None:
        """After a resume: approvals still wait (under their deadline); replies journaled meanwhile apply now."""
        for rec in list(self.state.records.values()):
            if rec.status == "waiting_approval":
                reply = rec.reply
                self._arm_deadline(rec)
                if reply is not None:
                    self.apply_reply(rec.id, reply, reply.get("pos"))

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        """Wait for a person to give step ``step_id`` a value (the ``human.input`` tool calls this)."""
        rec = self.state.records[step_id]
        if rec.given is not None:  # given before the run was interrupted: the step resumes with it
            return rec.given[0]
        reply = rec.reply  # a value journaled while no process ran the run
        waiter: asyncio.Future[Any] = self._loop.create_future()
        self._inputs[step_id] = waiter
        self._emission.emit("input_requested", step_id, {"prompt": prompt, "schema": schema})
        if reply is not None:
            self.apply_reply(step_id, reply, reply.get("pos"))
        try:
            return await waiter
        finally:
            if self._inputs.get(step_id) is waiter:
                del self._inputs[step_id]
