"""Speculative planning: a small fast draft model writes the plan ahead of the main planner, which verifies it.

While the main planner streams its initial plan, a draft model (any OpenAI-compatible model, usually a small fast
one: ``PlanningOptions(draft=client)``, ``planweave run --goal --draft-model NAME``) is asked the same prompt. Its
step lines are compared with the main planner's, position by position, by step *fingerprint* (tool, argument
template and dependencies, independent of step ids: :attr:`planweave.core.plan.graph.Plan.fingerprints`) and by every
other field of the step: the longest agreeing prefix is accepted, as in speculative decoding but over plan steps.

Draft steps that are safe to throw away (the engine's rule, :func:`planweave.core.speculation.unsafe_reason`:
idempotent, no ``writes:``, no approval, not ``human.input``, tool not ``speculate=False``) start at once as
speculative attempts, before the main planner has written them. Nothing else changes:

* the plan that runs is the main planner's alone (draft lines are never added to it);
* a draft attempt's output is held in memory; it becomes an output only when the main planner wrote the same step
  *and* that step, run by the engine on its real inputs, is called with the same arguments: the step's tool then
  returns the draft attempt's output instead of calling again (:class:`DraftPlanner.wrap`); otherwise the attempt is
  cancelled and thrown away and the tool runs as it would have;
* a draft attempt is journaled as ``speculation_started`` (``mode: draft``) and ends as ``speculation_adopted``
  (``draft_step``: the draft's id) or ``speculation_discarded`` with the reason; the draft model's call is a
  ``model_call`` of purpose ``draft``. A run killed mid-draft resumes from the main planner's steps only (a
  speculative attempt in flight is folded as interrupted, as any speculative attempt).

Re-plans and repairs (:meth:`DraftPlanner.begin_replan`) are drafted the same way, verified with the run's finished
steps as context; their verified attempts are kept only if the planner's proposal is spliced in
(:meth:`DraftSession.main_done` after the splice, else :meth:`DraftSession.abandon`).

Draft attempts run in the planner's process (the tool's ``invoke`` on the event loop), whatever the engine's
executor: an adoption happens only for a step executed in-process, elsewhere the step simply runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from planweave.core.context import StepContext, current_step_var, set_current_step
from planweave.core.errors import PlanInvalid
from planweave.core.events import Event
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import Plan, parse_step, validate_plan
from planweave.core.plan.model import PlanSpec, Step
from planweave.core.plan.refs import RefResolutionError, render
from planweave.core.speculation import canonical, same_args, unsafe_reason
from planweave.models import (
    Budget,
    BudgetExceeded,
    Completion,
    CompletionRequest,
    Delta,
    Message,
    ModelClient,
    Reservation,
)
from planweave.models.budget import StreamMeter
from planweave.models.pricing import PriceTable, approx_prompt_tokens, worst_case
from planweave.planning.lines import LineParser
from planweave.tools import Tool, Toolbox

if TYPE_CHECKING:
    from planweave.core.clock import Clock
    from planweave.engine.runtime import Run

# Fields of a step that do not change what its call returns, or are compared otherwise (fingerprint: tool, args,
# dependencies; ``resources``: the loop's model claim).
_NOT_SHAPE = {"id", "tool", "args", "after", "description", "resources"}


@dataclass(frozen=True)
class DraftOptions:
    """How a draft model drafts: ``client`` (its model is the client's) and at most ``max_parallel`` draft
    attempts in flight."""

    client: ModelClient
    max_parallel: int = 4
    max_tokens: int = 2048


def draft_options(draft: ModelClient | DraftOptions | None) -> DraftOptions | None:
    """``PlanningOptions.draft`` as options (a bare client takes the defaults)."""
    if draft is None or isinstance(draft, DraftOptions):
        return draft
    return DraftOptions(draft)


def agreeing_prefix(main: Sequence[Mapping[str, Any]], draft: Sequence[Mapping[str, Any]],
                    context: Sequence[Mapping[str, Any]] = ()) -> int:
    """How many leading steps of ``draft`` agree with ``main``: same fingerprint (tool, argument template,
    dependencies, ids aside) and every other field equal, position by position (pure). ``context``: the steps of the
    run both may refer to (a re-plan's finished steps), the same for both."""
    main_prints, draft_prints = _fingerprints(main, context), _fingerprints(draft, context)
    n = 0
    for m, d in zip(main_prints, draft_prints, strict=False):
        if m is None or d is None or m != d:
            break
        n += 1
    return n


def _fingerprints(objs: Sequence[Mapping[str, Any]],
                  context: Sequence[Mapping[str, Any]] = ()) -> list[tuple[str, str] | None]:
    """Per position, the step's (fingerprint, shape) in the plan of ``context`` then ``objs``, None from the first
    step that does not parse or validate (e.g. refers to a step that is not there)."""
    out: list[tuple[str, str] | None] = []
    plan, steps = _valid_prefix(objs, context)
    if plan is None:
        return [None] * len(objs)
    for step in steps:
        shape = canonical(step.model_dump(mode="json", exclude=_NOT_SHAPE, exclude_defaults=True))
        out.append((plan.fingerprints[step.id], shape))
    return out + [None] * (len(objs) - len(out))


@dataclass(eq=False)
class DraftAttempt:
    """A draft step started before the main planner wrote it: its rendered arguments and, once done, its output."""

    position: int
    step: str  # the draft's id
    tool: str
    args: Mapping[str, Any]
    started_at: float
    task: asyncio.Task[None] | None = None
    done: bool = False
    output: Any = None
    error: BaseException | None = None
    cost_usd: float = 0.0
    main: str | None = None  # the main planner's step it was verified against
    over: bool = False  # adopted or discarded
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    finished_at: float | None = None  # when it ended
    session: DraftSession | None = None

    def preempt(self) -> None:
        """A real step needs the spare slot it held (the dispatcher took it back): throw the attempt away, unless
        the step waiting is most likely its own verified step (ready, or already taking it): that step gets the
        slot and takes the attempt over instead of calling its tool from the start."""
        if self.session is None:
            return
        rec = self.session.run.state.records.get(self.main) if self.main is not None else None
        if rec is not None and rec.status in ("ready", "running"):
            return
        self.session._discard(self, "preempted by a real step")


class _Sink:
    """The draft attempt's StepSink: its model usage is journaled (flagged speculative), nobody is asked."""

    def __init__(self, session: DraftSession, attempt: DraftAttempt) -> None:
        self.session, self.attempt = session, attempt

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self.attempt.cost_usd += float(usage.get("cost_usd", 0.0) or 0.0)
        self.session.run.speculation.step_usage(step_id, {**usage, "speculative": True, "draft": True})

    def step_heartbeat(self, step_id: str) -> None:
        return None

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None:
        return None

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        raise RuntimeError("a draft attempt asks nobody")  # never reached: human.input is never drafted


class DraftSession:
    """One initial plan's draft: the draft model's stream, its attempts, and their verification against the main
    planner's lines (the loop calls :meth:`main_step`, :meth:`main_rejected` and :meth:`main_done`)."""

    def __init__(self, planner: DraftPlanner, run: Run, messages: Sequence[Message],
                 context: Sequence[Mapping[str, Any]] = (), *, replan: bool = False) -> None:
        self.planner, self.run = planner, run
        self.replan = replan  # a re-plan's lines become steps only when the whole proposal is spliced in
        self.context = [dict(c) for c in context]  # a re-plan's: the finished steps its lines may refer to
        self.main: list[dict[str, Any]] = []
        self.drafted: list[dict[str, Any]] = []
        self.attempts: dict[int, DraftAttempt] = {}
        self.verified = 0  # positions agreed so far
        self.diverged = False
        self._plan: Plan | None = None  # the draft prefix as a plan (templates, deps), None until it validates
        self._soon = False
        self._ended = False
        self.loop = asyncio.get_running_loop()
        self._stream: asyncio.Task[None] | None = run.speculation.spawn(self._draft(messages), "draft")
        run.subscribe(self._on_event)

    # -- what the loop tells it -------------------------------------------------------------------------------------
    def main_step(self, obj: Mapping[str, Any]) -> None:
        """The main planner's next step line, about to be admitted to the plan."""
        self.main.append(dict(obj))
        self._verify()

    def main_rejected(self) -> None:
        """The last main line was refused (a repair follows): it is no step, and positions no longer line up, so
        drafting stops."""
        last = len(self.main) - 1
        self._diverge("the main planner's line was rejected")
        att = self.attempts.get(last)
        if att is not None and att.main is not None:
            self._discard(att, "the main planner's line was rejected")

    def main_done(self) -> None:
        """The main planner finished its plan (a re-plan: and it was spliced in, or not): draft steps beyond it will
        never be verified, and a re-plan's verified ones whose step is not in the plan now never run."""
        self._verify()
        self._stop_stream()
        for pos, att in list(self.attempts.items()):
            if att.main is None:
                self._discard(att, f"beyond the main plan ({len(self.main)} steps)" if pos >= len(self.main)
                              else "not verified")
            elif self.replan and att.main not in self.run.plan.steps:
                self._discard(att, "the re-plan was not spliced in")
        self.diverged = True

    def abandon(self, reason: str) -> None:
        """The main planner's answer is not taken (a re-plan that was stale or invalid, asked again): every draft
        attempt not yet decided is thrown away; a later answer is not drafted."""
        self._diverge(reason)
        for att in list(self.attempts.values()):
            if not att.over:
                self._discard(att, reason)

    def adopt(self, step_id: str) -> DraftAttempt | None:
        """The verified draft attempt of main step ``step_id`` (not yet decided), if any."""
        for att in self.attempts.values():
            if att.main == step_id and not att.over:
                return att
        return None

    # -- verification ---------------------------------------------------------------------------------------------
    def _verify(self) -> None:
        if self.diverged:
            return
        upto = min(len(self.main), len(self.drafted))
        if upto <= self.verified:
            return
        agree = agreeing_prefix(self.main[:upto], self.drafted[:upto], self.context)
        for pos in range(self.verified, agree):
            att = self.attempts.get(pos)
            if att is not None:
                att.main = str(self.main[pos]["id"])
                if not self.planner.safe(_step(self.main[pos])):
                    self._discard(att, "the main planner's step is not safe to speculate")
        self.verified = agree
        if agree < upto:
            self._diverge(f"the main planner disagrees at line {agree + 1}")
        else:
            self._schedule()

    def _diverge(self, reason: str) -> None:
        self.diverged = True
        self._stop_stream()
        for att in list(self.attempts.values()):
            if att.main is None:
                self._discard(att, reason)

    # -- the draft model's stream --------------------------------------------------------------------------------
    async def _draft(self, messages: Sequence[Message]) -> None:
        client = self.planner.options.client
        request = CompletionRequest(messages=tuple(messages), max_tokens=self.planner.options.max_tokens)
        clock = self.planner.clock
        started = clock.now()
        meter = StreamMeter(approx_prompt_tokens(m.content for m in messages))
        parser = LineParser()
        completion: Completion | None = None
        cut: str | None = None
        reservation = self.planner.reserve(request)
        if reservation is False:
            self._stream = None
            self.diverged = True
            self.run.record("warning", {"message": "no draft: the budget has no room for the draft model's call "
                                                   "beside the planner's (planning/draft.py)"})
            return
        try:
            chunks: AsyncIterator[Any] = client.stream(request)
            async with contextlib.aclosing(chunks) as stream:  # type: ignore[type-var]
                async for chunk in stream:
                    meter.feed(chunk)
                    if isinstance(chunk, Delta):
                        self._lines(parser.feed(chunk.text))
                    elif isinstance(chunk, Completion):
                        completion = chunk
            self._lines(parser.close())
        except asyncio.CancelledError:
            cut = "cancelled"
            raise
        except Exception as exc:  # a draft model that fails only drafts nothing
            cut = type(exc).__name__
        finally:
            self._stream = None
            self._journal_call(client, started, completion, meter, cut, reservation)

    def _journal_call(self, client: ModelClient, started: float, completion: Completion | None, meter: StreamMeter,
                      cut: str | None, reservation: Reservation | None) -> None:
        budget = self.planner.budget  # charged what is journaled (a cut stream: its prompt and what it sent)
        if self.run.finished:
            if reservation is not None and budget is not None:
                budget.release(reservation)
            return  # nothing may be journaled after the run's end (its stream is cut by the run ending)
        if completion is not None:
            prompt, out, cost, model = (completion.prompt_tokens, completion.completion_tokens,
                                        completion.cost_usd or 0.0, completion.model)
        else:
            usage = meter.spent()
            prompt, out, model = usage.prompt_tokens, usage.completion_tokens, client.model
            prices = getattr(client, "prices", None)
            cost = (prices.cost(model, prompt, out) or 0.0) if isinstance(prices, PriceTable) else 0.0
        data: dict[str, Any] = {"purpose": "draft", "model": model, "prompt_tokens": prompt,
                                "completion_tokens": out, "cost_usd": cost, "started_at": started,
                                "finished_at": self.planner.clock.now(), "speculative": True}
        if cut is not None:
            data["cut"] = cut
        if reservation is not None and budget is not None:
            budget.settle(reservation, cost, prompt + out)
        self.run.record("model_call", data)

    def _lines(self, lines: Sequence[Any]) -> None:
        for line in lines:
            if self.diverged:
                return
            if line.error:
                self._diverge(f"the draft's line {line.number} is broken")
                return
            for obj in line.steps:
                self.drafted.append(dict(obj))
        self._plan = _draft_plan(self.drafted, self.context)
        self._verify()
        self._schedule()

    def _stop_stream(self) -> None:
        if self._stream is not None and self._stream is not asyncio.current_task():
            self._stream.cancel()

    # -- draft attempts -------------------------------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self._soon and not self._ended:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._soon = False
        plan = self._plan
        if self.diverged or self._ended or plan is None or self.run.finished:
            return
        in_flight = sum(1 for a in self.attempts.values() if not a.done and not a.over)
        ids = list(plan.order)
        lines = plan.spec.steps[len(self.context):]  # the context's steps are the run's, not drafted
        position = {sid: i for i, sid in enumerate(s.id for s in lines)}
        for sid in ids:
            if sid not in position:
                continue
            pos = position[sid]
            if in_flight >= self.planner.options.max_parallel:
                return
            if pos in self.attempts or (pos < self.verified and self._main_started(pos)):
                continue
            step = plan.steps[sid]
            if not self.planner.safe(step):
                continue
            args = self._args(plan, sid, position)
            if args is None:
                continue
            att = DraftAttempt(pos, sid, step.tool, args, self.planner.clock.now(), session=self)
            if not self.run.speculation.dispatcher.take_spare(att, None):
                return  # no spare slot: real steps come first (tried again when a step ends)
            task = self.run.speculation.spawn(self._attempt(att, step), sid)
            if task is None:
                self.run.speculation.dispatcher.give_back_spare(att)
                return
            att.task = task
            self.attempts[pos] = att
            in_flight += 1
            if pos < self.verified:
                att.main = str(self.main[pos]["id"])
            self.run.speculation.emit_speculation("speculation_started", sid, {
                "basis": {}, "confidence": 1.0, "mode": "draft", "line": pos + 1})

    def _main_started(self, pos: int) -> bool:
        """Whether main step ``pos`` (verified) already started or finished as a plain step: too late to draft."""
        rec = self.run.state.records.get(str(self.main[pos]["id"]))
        if rec is None:  # a re-plan's line, not proposed yet; or an initial line the plan did not take
            return not self.replan
        return rec.status != "pending"

    def _args(self, plan: Plan, sid: str, position: Mapping[str, int]) -> Mapping[str, Any] | None:
        """The draft step's arguments rendered on its dependencies' outputs (a finished draft attempt's, or the run's
        output of the verified main step), or None while one of them has none yet."""
        values: dict[str, Any] = {}
        for dep in plan.deps[sid]:
            if dep not in position:  # a context step: finished in the run
                if dep not in self.run.outputs:
                    return None
                values[dep] = self.run.outputs[dep]
                continue
            pos = position[dep]
            att = self.attempts.get(pos)
            if att is not None and att.done and att.error is None and not (att.over and att.main is None):
                values[dep] = att.output
                continue
            main = str(self.main[pos]["id"]) if pos < self.verified else None
            rec = self.run.state.records.get(main) if main is not None else None
            if main is None or rec is None or rec.status != "succeeded" or main not in self.run.outputs:
                return None
            values[dep] = self.run.outputs[main]
        if not plan.refs[sid]:
            template = plan.templates[sid]
            return template if isinstance(template, Mapping) else None
        try:
            args = render(plan.templates[sid], values)
        except (RefResolutionError, TypeError):
            return None
        return args if isinstance(args, Mapping) else None

    async def _attempt(self, att: DraftAttempt, step: Step) -> None:
        tool = self.planner.inner[step.tool]
        ctx = StepContext(self.run.id, att.step, 1, self.planner.clock, _Sink(self, att), None, None,
                          step.resources, self.run.priority)
        token = set_current_step(ctx)
        try:
            async with asyncio.timeout(step.timeout):
                att.output = await tool.invoke(att.args)
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # a failed draft attempt is thrown away
            att.error = exc
        finally:
            current_step_var.reset(token)
            att.done = True
            att.finished_at = self.planner.clock.now()
            att.finished.set()
            self.run.speculation.dispatcher.give_back_spare(att)
        if att.error is not None and att.main is None:
            self._discard(att, f"failed: {type(att.error).__name__}")
        self._schedule()

    def _discard(self, att: DraftAttempt, reason: str) -> None:
        if att.over:
            return
        att.over = True
        self.run.speculation.dispatcher.give_back_spare(att)
        if att.task is not None and not att.done:
            att.task.cancel()
        if not self.run.finished:
            self.run.speculation.emit_speculation("speculation_discarded", att.step, {
                "reason": f"draft: {reason}", "started_at": att.started_at, "cost_usd": round(att.cost_usd, 8)})

    async def take(self, att: DraftAttempt, step_id: str, args: Mapping[str, Any]) -> tuple[bool, Any]:
        """Main step ``step_id`` is called with ``args``: (True, the draft attempt's output) when it ran on these
        arguments and succeeded (adopted, journaled), else (False, None) after throwing it away."""
        if not same_args(att.args, args):
            self._discard(att, "mismatch: the real arguments differ")
            return False, None
        att.over = True  # decided: no discard may cancel it any more
        self.run.speculation.dispatcher.give_back_spare(att)  # it runs on as the step's attempt, in the step's own slot
        self._schedule()  # no longer a draft attempt in flight: room for another under max_parallel
        if not att.done:
            try:
                await att.finished.wait()
            except asyncio.CancelledError:  # the real step was cancelled (timeout, cancel): so is the attempt
                if att.task is not None:
                    att.task.cancel()
                raise
        if att.error is not None:
            att.over = False
            self._discard(att, f"failed: {type(att.error).__name__}")
            return False, None
        self.run.speculation.emit_speculation("speculation_adopted", step_id, {
            "started_at": att.started_at, "draft_step": att.step,
            **({} if att.finished_at is None else {"finished_at": att.finished_at})})
        return True, att.output

    def _on_event(self, event: Event) -> None:
        kind = event.kind
        if kind in ("run_finished", "run_cancelled"):
            self._end()
        elif kind == "step_started" and not self.diverged:
            self._schedule()  # a queued step started: a spare slot may be free again (take_spare refused it)
        elif event.step is not None and kind in ("step_succeeded", "step_failed", "step_skipped",
                                                 "step_cancelled"):
            for att in self.attempts.values():  # the main step ended without taking its draft attempt
                if att.main == event.step and not att.over:
                    asyncio.get_running_loop().call_soon(self._discard, att, f"the step {kind[5:]} without it")
            self._schedule()

    def _end(self) -> None:
        """The run is over: cancel what still runs, silently (a resume folds it as interrupted)."""
        self._ended = True
        self._stop_stream()
        for att in self.attempts.values():
            self.run.speculation.dispatcher.give_back_spare(att)
            if att.task is not None and not att.done:
                att.over = True
                att.task.cancel()


def _worst(request: CompletionRequest, client: ModelClient) -> tuple[float, int]:
    prices = getattr(client, "prices", None)
    usd, tokens = worst_case(request, client.model, prices if isinstance(prices, PriceTable) else PriceTable({}))
    return usd or 0.0, tokens


def _step(obj: Mapping[str, Any]) -> Step | None:
    try:
        return parse_step(dict(obj))
    except PlanInvalid:
        return None


def _draft_plan(objs: Sequence[Mapping[str, Any]], context: Sequence[Mapping[str, Any]] = ()) -> Plan | None:
    """The longest valid prefix of the draft's steps (after ``context``'s) as a plan (without tool checks), or
    None."""
    return _valid_prefix(objs, context)[0]


def _parsed(objs: Sequence[Mapping[str, Any]]) -> list[Step]:
    steps: list[Step] = []
    for obj in objs:
        try:
            steps.append(parse_step(dict(obj)))
        except PlanInvalid:
            break
    return steps


def _valid_prefix(objs: Sequence[Mapping[str, Any]],
                  context: Sequence[Mapping[str, Any]]) -> tuple[Plan | None, list[Step]]:
    """The plan of ``context``'s steps and the longest valid prefix of ``objs``'s, and that prefix's steps; (None,
    []) when not even one step of ``objs`` fits (the context is never cut)."""
    before = _parsed(context)
    if len(before) < len(context):
        return None, []
    steps = _parsed(objs)
    while steps:
        try:
            return validate_plan(PlanSpec(steps=(*before, *steps)), None, None, source="draft"), steps
        except PlanInvalid:
            steps.pop()
    return None, []


class DraftPlanner:
    """A planning loop's draft planning: wraps its tools so a verified draft attempt can stand in for a call, and
    starts a :class:`DraftSession` per initial plan."""

    def __init__(self, options: DraftOptions, tools: ToolCatalog, clock: Clock, *, budget: Budget | None = None,
                 planner: ModelClient | None = None, planner_max_tokens: int = 2048) -> None:
        self.options = options
        self.inner = tools
        self.clock = clock
        self.budget = budget  # the run's: the draft's call is charged to it, never at the planner's expense
        self.planner_client = planner
        self.planner_max_tokens = planner_max_tokens
        self.sessions: dict[str, list[DraftSession]] = {}  # run id -> its drafts: the initial plan's, re-plans'

    def reserve(self, request: CompletionRequest) -> Reservation | Literal[False] | None:
        """Reserve the draft call's worst case from the budget (None: no budget), or False when the budget could not
        hold it *and* the planner's own worst case: the draft must never make the planner wait or write less."""
        budget = self.budget
        if budget is None:
            return None
        usd, tokens = _worst(request, self.options.client)
        if self.planner_client is not None:
            main = CompletionRequest(messages=request.messages, max_tokens=self.planner_max_tokens)
            main_usd, main_tokens = _worst(main, self.planner_client)
        else:
            main_usd, main_tokens = usd, tokens
        room_usd, room_tokens = budget.remaining_usd, budget.remaining_tokens
        if (room_usd is not None and room_usd < usd + main_usd) or (
                room_tokens is not None and room_tokens < tokens + main_tokens):
            return False
        try:
            return budget.reserve(usd, tokens)
        except BudgetExceeded:  # another call took the room meanwhile
            return False

    def safe(self, step: Step | None) -> bool:
        """Whether ``step`` may run before the main planner wrote it (the engine's speculation rule)."""
        if step is None or step.isolation == "process" or step.executor == "ray":
            return False  # a draft attempt runs on the planner's event loop, which is not where this step may run
        if self.budget is not None and step.tool == "llm":
            return False  # it would spend the run's budget before the planner has asked for the step
        tool = self.inner.get(step.tool)
        if tool is None:
            return False
        idempotent = step.idempotent if step.idempotent is not None else bool(getattr(tool, "idempotent", False))
        return unsafe_reason(step, idempotent=idempotent,
                             tool_speculates=bool(getattr(tool, "speculate", True))) is None

    def begin(self, run: Run, messages: Sequence[Message]) -> DraftSession:
        """Draft the initial plan of ``run`` (asked with ``messages``)."""
        session = DraftSession(self, run, messages)
        self.sessions.setdefault(run.id, []).append(session)
        return session

    def begin_replan(self, run: Run, messages: Sequence[Message]) -> DraftSession:
        """Draft a re-plan of ``run``: its lines may refer to the run's finished steps; a verified draft attempt is
        adopted once the main planner's proposal is spliced in and its step runs (:meth:`DraftSession.main_done`
        after the splice)."""
        context = [run.plan.steps[sid].model_dump(exclude_defaults=True)
                   for sid, rec in run.state.records.items() if rec.status == "succeeded" and sid in run.plan.steps]
        session = DraftSession(self, run, messages, context, replan=True)
        self.sessions.setdefault(run.id, []).append(session)
        return session

    def wrap(self) -> ToolCatalog:
        """The catalog the run uses: each :class:`Tool` answers a call its verified draft attempt already made."""
        if not isinstance(self.inner, Mapping):
            return self.inner
        wrapped: dict[str, Tool] = {}
        for name, tool in self.inner.items():
            if isinstance(tool, Tool):
                wrapped[name] = _AdoptingTool(**{f.name: getattr(tool, f.name) for f in fields(Tool)},
                                              planner=self, inner=tool)
            else:
                return self.inner
        return Toolbox(wrapped)

    async def call(self, tool: Tool, args: Mapping[str, Any]) -> Any:
        ctx = current_step_var.get(None)
        for session in self.sessions.get(ctx.run_id, ()) if ctx is not None else ():
            if asyncio.get_running_loop() is not session.loop:
                break  # (an executor's own thread or loop calls the tool itself)
            assert ctx is not None
            att = session.adopt(ctx.step_id)
            if att is not None:
                ok, output = await session.take(att, ctx.step_id, args)
                if ok:
                    return output
                break
        return await tool.invoke(args)


@dataclass(frozen=True)
class _AdoptingTool(Tool):
    """A tool whose call returns the output of the step's verified draft attempt when it made the same call."""

    planner: DraftPlanner | None = None
    inner: Tool | None = None

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        assert self.planner is not None and self.inner is not None
        return await self.planner.call(self.inner, args)
