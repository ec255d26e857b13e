"""Speculative attempts of a run: started on predicted inputs in spare slots, adopted or thrown away (runtime side).

:mod:`planweave.core.speculation` decides; the :class:`Speculator` of a run carries it out on the event loop. A
speculative attempt is a task of the run's TaskGroup that calls the step's tool on the predicted arguments and keeps
its output in memory: nothing of it reaches the journal but ``speculation_started`` and, in the end,
``speculation_adopted`` (followed by the step's ordinary ``step_started``/``step_succeeded``) or
``speculation_discarded``. It holds a spare slot of the engine's :class:`~planweave.engine.dispatch.Dispatcher`,
which takes it back (preempts the attempt) the moment a real step waits for it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from planweave.core.context import StepContext
from planweave.core.errors import ToolError
from planweave.core.events import EventKind
from planweave.core.plan.cache import tool_version
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import Plan
from planweave.core.plan.model import Claim, PlanSpec, SpeculationMode, SpeculationSpec
from planweave.core.plan.refs import RefResolutionError
from planweave.core.speculation import (
    OFF,
    POLICIES,
    Calibration,
    Prediction,
    PredictionSource,
    Predictor,
    candidates,
    canonical,
    history_key,
    same_args,
    unsafe_reason,
    within_cost,
)
from planweave.core.state import RunState, StepRecord
from planweave.engine import attempt as _attempt
from planweave.engine.cache import cache_key
from planweave.engine.dispatch import Dispatcher
from planweave.engine.executor import ToolCall
from planweave.journal.base import Journal, canonical_output, find_cached

if TYPE_CHECKING:
    from planweave.core.clock import Clock

_NO_GUESS = object()  # asked the predictor, no answer (yet)
_PENDING = object()  # asked the journal, no answer yet


def resolve_policy(spec: PlanSpec, override: SpeculationSpec | SpeculationMode | None) -> SpeculationSpec:
    """The speculation a run does: ``override`` (a policy, or a ``--speculate`` mode, which keeps the plan's
    limits), else the plan's ``speculation:``, else none."""
    if isinstance(override, SpeculationSpec):
        return override
    if override is None:
        return spec.speculation or OFF
    if override not in POLICIES:
        raise ValueError(f"speculation mode must be off, safe or eager, got {override!r}")
    if spec.speculation is not None:
        return spec.speculation.model_copy(update={"mode": override})
    return POLICIES[override]


class SpeculativeRun(Protocol):
    """What a :class:`Speculator` needs of its run (a run's :class:`planweave.engine.hooks.SpeculationHooks`)."""

    id: str
    state: RunState
    outputs: dict[str, Any]
    priority: float

    def emit_speculation(self, kind: EventKind, sid: str, data: Mapping[str, Any]) -> None:
        """Journal a ``speculation_*`` event of step ``sid``."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], sid: str) -> asyncio.Task[None] | None:
        """Start ``coro`` in the run's TaskGroup (None, and the coroutine closed, when the run is ending)."""
        ...

    async def call_tool(self, call: ToolCall) -> Any:
        """Execute ``call`` as the run executes its steps' calls (timeout, heartbeat)."""
        ...

    def adopt_finished(self, rec: StepRecord, started_at: float, output: Any,
                       args: Mapping[str, Any] | None = None, *, finished_at: float | None = None) -> None:
        """Make a finished speculative attempt's ``output`` (on ``args``, the real ones; it ended at
        ``finished_at``) the output of step ``rec`` (which is ready)."""
        ...

    def adopt_running(self, rec: StepRecord, started_at: float, task: asyncio.Task[None]) -> int:
        """Make the running speculative attempt ``task`` the attempt of step ``rec``; return its number."""
        ...

    def settle_adopted(self, rec: StepRecord, attempt: int, claims: Claim | None, output: Any,
                       error: BaseException | None, *, slot: bool = True,
                       args: Mapping[str, Any] | None = None) -> None:
        """The adopted attempt (on ``args``) ended with ``output`` or ``error``: journal it as any attempt's outcome
        (indexed in the result cache as one)."""
        ...

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None: ...

    def step_heartbeat(self, step_id: str) -> None: ...


@dataclass(eq=False)
class SpeculativeAttempt:
    """One speculative attempt: what it was started on, and (once done) its output in memory."""

    owner: Speculator
    rec: StepRecord
    args: Mapping[str, Any]
    basis: Mapping[str, PredictionSource]
    values: Mapping[str, Any]  # the predicted output of each producer in the basis
    confidence: float
    started_at: float
    claim: Claim | None
    estimate_usd: float
    task: asyncio.Task[None] | None = None
    done: bool = False
    output: Any = None
    cost_usd: float = 0.0
    adopted: int = 0  # the attempt number it became, once adopted
    finished_at: float | None = None  # when it ended (done)
    over: bool = False  # discarded

    @property
    def step(self) -> str:
        return self.rec.id

    def preempt(self) -> None:
        """A real step needs the slot (the dispatcher took it back): throw the attempt away."""
        self.owner.discard(self, "preempted")

    # A StepSink for the attempt's tool: usage is journaled (flagged speculative) and counted; no person is asked.
    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self.cost_usd += float(usage.get("cost_usd", 0.0) or 0.0)
        self.owner.run.step_usage(step_id, {**usage, "speculative": True})

    def step_heartbeat(self, step_id: str) -> None:
        self.owner.run.step_heartbeat(step_id)

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self.owner.run.step_heartbeat(step_id)  # progress of an attempt that may be thrown away is not journaled

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        raise ToolError(f"step '{step_id}' runs speculatively and cannot wait for a person", kind="arguments")


@dataclass
class Speculator:
    """The speculative attempts of one run, driven by the run's events (never by polling)."""

    run: SpeculativeRun
    policy: SpeculationSpec
    dispatch: Dispatcher
    tools: ToolCatalog
    clock: Clock
    max_output_bytes: int | None = None
    predictor: Predictor | None = None
    journal: Journal | None = None  # history across runs: outputs indexed under their cache keys (find_cached)
    attempts: dict[str, SpeculativeAttempt] = field(default_factory=dict)  # undecided, by step
    history: dict[str, Any] = field(default_factory=dict)  # history_key -> output of a finished attempt
    calibration: Calibration = field(default_factory=Calibration)
    spent_usd: float = 0.0  # what the discarded attempts cost
    _learned: dict[str, StepRecord] = field(default_factory=dict)  # the succeeded records already learned from
    _keys: dict[str, tuple[StepRecord, str]] = field(default_factory=dict)  # history keys of ready/running calls
    _asked: dict[str, tuple[StepRecord, Any]] = field(default_factory=dict)  # the predictor's answers (or _NO_GUESS)
    _recalled: dict[str, tuple[StepRecord, Any]] = field(default_factory=dict)  # the journal's (or _NO_GUESS)
    _predicting_usd: float = 0.0  # the worst cases of the predictor's calls in flight
    _plan: Plan | None = None  # the plan version the producers below are of
    _producers: tuple[str, ...] = ()  # steps a safe dependent references: the only ones worth predicting
    _producer_set: frozenset[str] = frozenset()
    _producer_tools: frozenset[str] = frozenset()
    _soon: bool = False
    _closed: bool = False

    # -- what the run tells it ------------------------------------------------------------------------------
    def schedule(self) -> None:
        """Look for steps to speculate on once the loop turns (after the deferred admission of real steps).

        The fast path: a plan version where no step references a producer it could speculate on (``after:`` edges
        only, every consumer unsafe) has nothing to predict, and costs a step two attribute reads here.
        """
        if self._soon or self._closed:
            return
        if self._plan is self.run.state.plan and not self._producers and not self.attempts:
            return
        self._soon = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _refresh(self) -> None:
        """Once per plan version: the producers a prediction could help (a safe dependent references them, they
        claim no ``writes:``) and their tools (outputs of other calls of those tools are history)."""
        plan = self.run.state.plan
        if plan is self._plan:
            return
        self._plan = plan
        producers: dict[str, None] = {}
        for sid, refs in plan.refs.items():
            if not refs or not self._safe(sid):
                continue
            for ref in refs:
                if ref.step in plan.steps and not plan.steps[ref.step].writes:
                    producers[ref.step] = None
        self._producers = tuple(producers)
        self._producer_set = frozenset(producers)
        self._producer_tools = frozenset(plan.steps[p].tool for p in producers)

    def predicts_for(self, sid: str) -> bool:
        """Whether step ``sid`` of the current plan version is a producer a prediction could help: the run indexes
        its output for later runs' history predictions."""
        if self._plan is not self.run.state.plan:
            self._refresh()
        return sid in self._producer_set

    def _learn(self) -> None:
        """Remember the outputs of the steps that succeeded since the last look, and score their predictions."""
        state = self.run.state
        outputs = self.run.outputs
        tools = self._producer_tools
        producers = self._producer_set
        plan = state.plan
        for sid, rec in state.records.items():
            if rec.status != "succeeded" or self._learned.get(sid) is rec or sid not in outputs:
                continue
            if sid not in producers and plan.steps[sid].tool not in tools:
                self._learned[sid] = rec  # no prediction of it, no history any producer could use
                continue
            self._learned[sid] = rec
            try:
                _tool, args = _attempt.prepare(state.plan, rec, outputs, self.tools)
            except (RefResolutionError, KeyError):
                args = None
            self.succeeded(sid, None if rec.fallback_active else args, outputs[sid])

    def succeeded(self, sid: str, args: Mapping[str, Any] | None, output: Any) -> None:
        """Step ``sid`` succeeded with ``output`` on ``args``: remember it, and score the predictions of it."""
        state = self.run.state
        step = state.plan.steps.get(sid)
        if step is None:
            return
        if step.predict is not None:
            self.calibration.observe("plan", step.predict, output)
        asked = self._asked.get(sid)
        if asked is not None and asked[1] is not _NO_GUESS and asked[0] is state.records.get(sid):
            self.calibration.observe("model", asked[1], output)
        recalled = self._recalled.get(sid)
        if recalled is not None and recalled[1] is not _NO_GUESS and recalled[1] is not _PENDING \
                and recalled[0] is state.records.get(sid):
            self.calibration.observe("history", recalled[1], output)
        if args is not None and sid in state.idempotent:
            key = history_key(step.tool, args)
            if key in self.history:
                self.calibration.observe("history", self.history[key], output)
            self.history[key] = output

    def resolve(self, rec: StepRecord) -> bool:
        """Step ``rec`` is ready and has a speculative attempt: adopt it if its arguments are the real ones (True:
        the run neither queues nor starts the step), else throw it away (False: the step runs as any other)."""
        spec = self.attempts.pop(rec.id)
        if spec.rec is not rec:
            self.discard(spec, "replaced by a new plan version")
            return False
        state = self.run.state
        try:
            _tool, real = _attempt.prepare(state.plan, rec, self.run.outputs, self.tools)
        except RefResolutionError:
            real = None
        if real is None or not same_args(spec.args, real):
            wrong = sorted(spec.basis)
            self.discard(spec, "mismatch: " + ", ".join(wrong))
            return False
        if spec.done:
            spec.over = True
            self.run.adopt_finished(rec, spec.started_at, spec.output, spec.args, finished_at=spec.finished_at)
            return True
        assert spec.task is not None
        self.dispatch.promote(spec)
        spec.adopted = self.run.adopt_running(rec, spec.started_at, spec.task)
        return True

    def close(self) -> None:
        """The run is ending: throw away what is still undecided."""
        self._closed = True
        for spec in list(self.attempts.values()):
            self.discard(spec, "the run ended")

    # -- deciding --------------------------------------------------------------------------------------------
    def discard(self, spec: SpeculativeAttempt, reason: str) -> None:
        """Throw a speculative attempt away: journaled with ``reason``; its task is cancelled, its slot freed."""
        if spec.over or spec.adopted:
            return
        spec.over = True
        if self.attempts.get(spec.step) is spec:
            del self.attempts[spec.step]
        self.spent_usd += spec.cost_usd
        self.dispatch.give_back_spare(spec)
        if spec.task is not None and not spec.done:
            spec.task.cancel()
        self.run.emit_speculation("speculation_discarded", spec.step, {
            "reason": reason, "started_at": spec.started_at, "cost_usd": round(spec.cost_usd, 8)})
        self.schedule()

    def _forget(self, spec: SpeculativeAttempt) -> None:
        """Drop an attempt without a word in the journal (its task is being cancelled with the run)."""
        spec.over = True
        if self.attempts.get(spec.step) is spec:
            del self.attempts[spec.step]
        self.dispatch.give_back_spare(spec)

    def _tick(self) -> None:
        self._soon = False
        if self._closed or self.policy.mode == "off":
            return
        self._refresh()
        if not self._producers and not self.attempts:
            return
        self._learn()
        predictions = self._predictions()
        self._sweep(predictions)
        self._start(predictions)

    def _sweep(self, predictions: Mapping[str, Prediction]) -> None:
        """Throw away attempts that can no longer be adopted: their step moved on, or a producer will never finish;
        in eager mode also those a producer's own speculative output now contradicts (they start again on it)."""
        records = self.run.state.records
        for spec in list(self.attempts.values()):
            if self.policy.mode == "eager":
                stale = next((p for p, value in spec.values.items() if p in predictions
                              and predictions[p].source == "speculation"
                              and canonical(predictions[p].value) != canonical(value)), None)
                if stale is not None:
                    self.discard(spec, f"rebased: {stale}")
                    continue
            if records.get(spec.step) is not spec.rec:
                self.discard(spec, "replaced by a new plan version")
            elif spec.rec.status != "pending":
                self.discard(spec, f"the step is {spec.rec.status}")
            else:
                dead = next((p for p in spec.basis if records.get(p) is None
                             or records[p].status in ("failed", "skipped", "cancelled", "unknown")), None)
                if dead is not None:
                    status = records[dead].status if dead in records else "gone"
                    self.discard(spec, f"producer {dead} {status}")

    def _predictions(self) -> dict[str, Prediction]:
        state = self.run.state
        plan = state.plan
        calibration = self.calibration
        found: dict[str, Prediction] = {}
        plan_confidence = calibration.confidence("plan")
        history_confidence = calibration.confidence("history")
        if self.policy.mode == "eager":  # a chain: a done speculative attempt's output predicts its step's
            for spec in self.attempts.values():
                if spec.done and (plan.steps[spec.step].predict is None or spec.confidence >= plan_confidence):
                    found[spec.step] = Prediction(spec.output, spec.confidence, "speculation")
        records = state.records
        for sid in self._producers:
            rec = records.get(sid)
            if rec is None or rec.status == "succeeded":
                continue
            step = plan.steps[sid]
            if (self.history and rec.status in ("ready", "running") and sid in state.idempotent
                    and plan.dependents[sid]):
                key = self._key(rec)
                if key is not None and key in self.history:
                    found[sid] = Prediction(self.history[key], history_confidence, "history")
                    continue
            if step.predict is not None and sid not in found:
                found[sid] = Prediction(step.predict, plan_confidence, "plan")
                continue
            if self.journal is not None and rec.status in ("ready", "running") and sid in state.idempotent \
                    and plan.dependents[sid] and not self._journal_had_none(rec, found, history_confidence):
                continue  # the journal is free, so asked first: the predictor only once it has nothing
            if self.predictor is not None and sid not in found and plan.dependents[sid] and rec.status in (
                    "ready", "running"):
                asked = self._asked.get(sid)
                if asked is None or asked[0] is not rec:
                    self._ask(rec)
                elif asked[1] is not _NO_GUESS:
                    found[sid] = Prediction(asked[1], calibration.confidence("model"), "model")
        return found

    def _ask(self, rec: StepRecord) -> None:
        """Ask the predictor for ready or running step ``rec``'s output, within the extra cost speculation may add:
        the predictor's worst case (its ``estimate_usd``, if it has one), with what speculation spent and what is in
        flight, must fit ``max_extra_cost_usd``, or it is not asked (once per record either way)."""
        if self.predictor is None:
            return
        state = self.run.state
        try:
            _tool, args = _attempt.prepare(state.plan, rec, self.run.outputs, self.tools)
        except (RefResolutionError, KeyError):
            return
        self._asked[rec.id] = (rec, _NO_GUESS)  # asked: not again for this record
        estimate_of = getattr(self.predictor, "estimate_usd", None)
        estimate = float(estimate_of(state.plan.steps[rec.id], args) or 0.0) if estimate_of is not None else 0.0
        in_flight = sum(s.estimate_usd for s in self.attempts.values() if not s.done) + self._predicting_usd
        if not within_cost(self.policy, self.spent_usd, in_flight, estimate):
            return
        self._predicting_usd += estimate
        self.run.spawn(self._predict(rec, self.predictor, args, estimate), rec.id)

    async def _predict(self, rec: StepRecord, predictor: Predictor, args: Mapping[str, Any],
                       estimate: float = 0.0) -> None:
        step = self.run.state.plan.steps[rec.id]
        try:
            reply = await predictor.predict(step, args)
        except Exception:  # a predictor that fails only makes no prediction
            reply = None
        finally:
            self._predicting_usd -= estimate
        if reply is None:
            return
        if reply.usage:
            self.spent_usd += float(reply.usage.get("cost_usd", 0.0) or 0.0)  # always extra: nothing adopts it
            self.run.step_usage(rec.id, {**reply.usage, "purpose": "predict", "speculative": True})
        if reply.guessed and self._asked.get(rec.id, (None,))[0] is rec:
            self._asked[rec.id] = (rec, reply.value)
            self.schedule()

    def _journal_had_none(self, rec: StepRecord, found: dict[str, Prediction], confidence: float) -> bool:
        """Whether the journal answered that it holds no earlier output of ``rec``'s call; False while it is asked
        (asked now if it was not), or when it held one (then in ``found``, a history prediction)."""
        recalled = self._recalled.get(rec.id)
        if recalled is None or recalled[0] is not rec:
            self._recall(rec)
            recalled = self._recalled[rec.id]
        if recalled[1] is _NO_GUESS:
            return True
        if recalled[1] is not _PENDING:
            found[rec.id] = Prediction(recalled[1], confidence, "history")
        return False

    def _recall(self, rec: StepRecord) -> None:
        """Ask the journal for an earlier output of ready or running step ``rec``'s call (same tool, version and
        arguments, any run of the journal): a history prediction, verified when the step really finishes."""
        state = self.run.state
        step = state.plan.steps[rec.id]
        tool = self.tools.get(step.tool)
        try:
            _tool, args = _attempt.prepare(state.plan, rec, self.run.outputs, self.tools)
            key = None if tool is None else cache_key(tool.name, tool_version(tool), args)
        except (RefResolutionError, KeyError, TypeError, ValueError):
            key = None
        if key is None or self.journal is None:
            self._recalled[rec.id] = (rec, _NO_GUESS)
            return
        self._recalled[rec.id] = (rec, _PENDING)
        self.run.spawn(self._recalling(rec, self.journal, key), rec.id)

    async def _recalling(self, rec: StepRecord, journal: Journal, key: str) -> None:
        try:
            found = await find_cached(journal, key, -math.inf)
        except Exception:  # a journal that cannot answer only makes no prediction
            found = None
        if self._recalled.get(rec.id, (None,))[0] is rec:
            self._recalled[rec.id] = (rec, _NO_GUESS if found is None else found.value)
            self.schedule()

    def _key(self, rec: StepRecord) -> str | None:
        """The history key of ready or running step ``rec``'s call (its inputs exist), rendered once per record."""
        known = self._keys.get(rec.id)
        if known is not None and known[0] is rec:
            return known[1]
        state = self.run.state
        try:
            _tool, args = _attempt.prepare(state.plan, rec, self.run.outputs, self.tools)
        except (RefResolutionError, KeyError):
            return None
        key = history_key(state.plan.steps[rec.id].tool, args)
        self._keys[rec.id] = (rec, key)
        return key

    def _safe(self, sid: str) -> bool:
        state = self.run.state
        step = state.plan.steps[sid]
        tool = self.tools.get(step.tool)
        if tool is None:
            return False
        return unsafe_reason(step, idempotent=sid in state.idempotent,
                             tool_speculates=bool(getattr(tool, "speculate", True))) is None

    def _start(self, predictions: Mapping[str, Prediction]) -> None:
        policy = self.policy
        in_flight = [s for s in self.attempts.values() if not s.done]
        if len(in_flight) >= policy.max_parallel:
            return
        state = self.run.state
        records = state.records
        found = candidates(state.plan, lambda s: records[s].status, self.run.outputs, predictions,
                           safe=self._safe, policy=policy, exclude=self.attempts)
        in_flight_usd = sum(s.estimate_usd for s in in_flight)
        for candidate in found:
            if len(in_flight) >= policy.max_parallel:
                return
            step = state.plan.steps[candidate.step]
            estimate = step.estimate.cost if step.estimate is not None else 0.0
            if not within_cost(policy, self.spent_usd, in_flight_usd, estimate):
                continue
            claim = state.plan.claims[candidate.step]
            spec = SpeculativeAttempt(self, records[candidate.step], candidate.args, candidate.basis,
                                      {p: predictions[p].value for p in candidate.basis},
                                      candidate.confidence, self.clock.now(), claim, estimate)
            if not self.dispatch.take_spare(spec, claim):
                if claim is None:
                    return  # no spare slot at all
                continue
            task = self.run.spawn(self._attempt(spec), candidate.step)
            if task is None:
                self.dispatch.give_back_spare(spec)
                return
            spec.task = task
            self.attempts[candidate.step] = spec
            in_flight.append(spec)
            in_flight_usd += estimate
            self.run.emit_speculation("speculation_started", candidate.step, {
                "basis": dict(candidate.basis), "confidence": round(candidate.confidence, 6),
                "mode": policy.mode})

    async def _attempt(self, spec: SpeculativeAttempt) -> None:
        """The speculative attempt's task: the tool call on predicted arguments, then wait to be decided."""
        run = self.run
        state = run.state
        step = state.plan.steps[spec.step]
        output: Any = None
        error: BaseException | None = None
        try:
            tool = self.tools[step.tool]
            call = ToolCall(tool, spec.args, StepContext(run.id, spec.step, 1, self.clock, spec, step.isolation,
                                                         step.executor, step.resources, run.priority,
                                                         state.plan.slack.get(spec.step)))
            output = await run.call_tool(call)
            output = canonical_output(output, step=spec.step, limit=self.max_output_bytes).value
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancelled = task is not None and task.cancelling() > 0
            if not spec.adopted:
                if cancelled:  # thrown away already, or the run is ending: journaled as a crash would leave it
                    self._forget(spec)
                else:
                    self.discard(spec, "the tool raised CancelledError")
                raise
            if cancelled:
                raise  # the run stopped, or cancelled the step: it journals that
            error = RuntimeError("tool raised CancelledError")
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            error = exc
        if spec.adopted:
            run.settle_adopted(spec.rec, spec.adopted, spec.claim, output, error, args=spec.args)
            return
        spec.done = True
        spec.finished_at = self.clock.now()
        self.dispatch.give_back_spare(spec)
        if spec.over:
            return
        if error is not None:
            self.discard(spec, f"failed: {type(error).__name__}")
            return
        spec.output = output
        self.schedule()  # a slot is free, and in eager mode the output may be a prediction
