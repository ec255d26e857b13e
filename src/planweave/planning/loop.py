"""The planning loop: plan a goal with a model, stream the plan into execution, re-plan while it runs.

Planning, execution and re-planning overlap. The initial plan streams in as JSON Lines and each step is admitted to
the running plan the moment its line is complete (:meth:`Run.extend`), so the first tool call starts while the
model is still writing. Triggers — a step that failed for good, an observation step's result, a verifier's
rejection, the plan running out — start a re-plan while independent steps keep running; the proposal is spliced in
by state matching (:meth:`Run.propose`) against the state when it arrives. Failures climb an explicit ladder, each
rung journaled: retry and fallback (in the engine) → local repair of the failed step's downstream region → global
re-plan → (with ``ask_human``) a person's answer to a ``human.input`` question: retry, skip with a value, or abort →
fail with a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from planweave.allocate.cascade_seam import PlannerCascade
from planweave.allocate.monitors import Signal, SignalKind
from planweave.core.errors import PlanInvalid, RunError
from planweave.core.events import Event
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import parse_step
from planweave.core.plan.model import PlanSpec
from planweave.core.plan.refs import rename_refs
from planweave.core.splice import StaleProposal
from planweave.core.state import RunState
from planweave.engine.runtime import Engine, Run, RunResult
from planweave.limits import LimitsRecord, RunLimits
from planweave.models import (
    Budget,
    BudgetExceeded,
    CallClass,
    Completion,
    CompletionRequest,
    Delta,
    Message,
    ModelClient,
    Reservation,
    ToolCallDelta,
    ToolSpec,
    Usage,
    call_context,
)
from planweave.models.budget import StreamMeter, acquire_call
from planweave.models.endpoint import Endpoint
from planweave.models.errors import ModelError, ModelTimeout, ModelUnavailable, ProviderError
from planweave.models.pricing import PriceTable, approx_prompt_tokens, worst_case
from planweave.planning import prompts
from planweave.planning.context import ContextLimits, RedactedOutputs, ReferenceBook, bounded_context
from planweave.planning.draft import DraftOptions, DraftPlanner, DraftSession, draft_options
from planweave.planning.lines import Line, LineParser
from planweave.planning.subplans import SUBPLAN_TOOL
from planweave.planning.tool_calls import StepCalls, calls_as_lines, planner_tools
from planweave.tools import Toolbox
from planweave.tools.context import context_read_tool, referencing_llm_tool

_NO_PRICES = PriceTable({})  # a client without a price table: calls cost nothing in dollars
NO_STEP_LINE = ("the reply has no step line: write each step as a JSON object on its own line, or [] if no step "
                "is needed")


PlanVia = Literal["auto", "tools", "text"]
#: Statuses with which an endpoint that cannot take ``tools`` refuses the request (``auto`` then plans in text).
_TOOLS_REFUSED = (400, 404, 422, 501)


@dataclass(frozen=True)
class PlanningOptions:
    """Limits and modes of the planning loop."""

    max_replans: int = 5
    max_repairs: int = 2  # attempts to fix rejected lines or an invalid proposal, per model call
    max_stale_retries: int = 2
    max_staleness: int | None = None  # events since the re-planner looked beyond which a proposal is refused
    plan_max_tokens: int = 2048
    join_max_tokens: int = 1024
    # The least a planner's or joiner's reply may be lowered to when the budget has less room than max_tokens left
    # and nothing in flight can free more: below it the call is refused and the run stops, failed, by its budget.
    plan_min_tokens: int = 256
    join_min_tokens: int = 128
    summary_chars: int = 4000
    deadline_s: float | None = None
    synchronous: bool = False  # re-plan only once every step stopped (the LLMCompiler way; for comparisons)
    join: bool = True  # ask the model for a final answer when the plan runs out
    stream_admission: bool = True  # admit each step as its line arrives (False: wait for the whole plan)
    local_repair: bool = True  # repair a failed step's region first (False: go straight to a global re-plan)
    model_capacity: int | None = 8  # `llm` steps claim one unit of resource "model:<name>" (None: no claim)
    ask_human: bool = False  # the last rung: ask a person (human.input) what to do instead of failing the run
    # What the planner, re-planner, joiner and `llm` steps see of the run: "references" (the default: report +
    # frontier + outputs by reference, bounded whatever the run's length: planning/context.py) or "summary" (every
    # step, cut at summary_chars: the state summary of before, the baseline of `planweave bench context`).
    context: Literal["references", "summary"] = "references"
    context_limits: ContextLimits = field(default_factory=ContextLimits)
    # Speculative planning (planning/draft.py): a small fast model drafts the initial plan and each re-plan (or
    # repair) ahead of the planner, whose lines verify it; agreeing safe draft steps start early. None: the planner
    # plans alone.
    draft: ModelClient | DraftOptions | None = None
    # How the planner writes its plans, re-plans and repairs: "tools" (one native add_step call per step, each
    # admitted when its arguments complete: planning/tool_calls.py), "text" (JSON Lines in the reply) or "auto"
    # (tools when the client speaks a dialect with tool calls, text otherwise or when the endpoint refuses them).
    # A reply in text while tools were offered is read as JSON Lines in every mode.
    plan_via: PlanVia = "auto"


@dataclass(frozen=True)
class _Trigger:
    kind: str  # failure | observation | verifier | human (a person answered; reason: the question step)
    # | deadline (deadline pressure: re-plan with the time left; reason: what the planner is told)
    step: str
    reason: str


@dataclass
class _OpenCall:
    """A model call of the loop in flight: what it has cost so far and the reservation it holds."""

    purpose: str
    started: float
    meter: StreamMeter
    reservation: Reservation | None
    ended: bool = False  # charged or released (by the call itself, or by the run stopping under it)
    model: str | None = None  # the model called, when not the client's own (the planner's cascade tier)
    reservation_id: str | None = None  # its journaled model_reserved (a budgeted call), settled by its model_call


_DEFERRED = ("observation", "human", "deadline")  # triggers that are not failures to repair together


class PlanningLoop:
    """Runs one goal to an answer (or a clear failure) on an engine, with a model and tools."""

    def __init__(
        self,
        engine: Engine,
        client: ModelClient,
        tools: ToolCatalog,
        *,
        budget: Budget | None = None,
        options: PlanningOptions = PlanningOptions(),
        limits: RunLimits | None = None,
        cascade: PlannerCascade | None = None,
        endpoint: Endpoint | None = None,
        pressure: float | None = None,
        recall: Callable[[str], Awaitable[str]] | None = None,
        origin: str | None = None,
        parent: Mapping[str, Any] | None = None,
    ) -> None:
        """A loop for one goal run on ``engine``, planning with ``client`` and ``tools``, built complete here.

        ``limits`` are journaled in ``run_created`` (``options.limits``) beside ``pressure`` (a deadline-pressure
        threshold, --deadline-pressure), ``origin`` (who started it: a server's recovery resumes its own) and
        ``parent`` (a sub-plan's link to its parent run, step and depth: planning/subplans.py), so a resume applies
        them again. ``cascade``: the planner's model tier, escalated when its monitors fire. ``recall`` (memory across
        runs, :class:`planweave.memory.MemoryRecall`): the goal -> a prompt section of verified lessons and skills,
        asked once before the initial plan.
        """
        if options.ask_human and "human.input" not in tools:
            raise ValueError("ask_human needs the 'human.input' tool in the catalog (planweave.builtin_tools() has "
                             "it)")
        self.engine = engine
        self.client = client
        self.tools = tools
        self.budget = budget
        self.options = options
        self.limits = limits  # journaled in run_created (options.limits), so a resume applies them again
        # The endpoint the client was given: its base URL and key variable journaled beside them (never the key).
        self.endpoint = endpoint
        self.pressure = pressure  # a deadline-pressure threshold to journal beside them (--deadline-pressure)
        self.cascade = cascade  # the planner's model tier: escalated when its monitors fire (allocate/cascade_seam)
        self.parent = parent  # a sub-plan's link to its parent (run, step, depth), journaled in run_created
        self.origin = origin  # who started it, journaled (options.limits.origin): a server's recovery
        self.recall = recall  # memory across runs: None, no memory
        self._run: Run | None = None  # the one run this loop drives (start or resume binds it)
        self._triggers: list[_Trigger] = []
        self._wake = asyncio.Event()
        self._replans = 0
        self._repaired: set[str] = set()
        self._planning = True  # the initial plan is still streaming in
        self._questions: dict[str, str] = {}  # human.input step asking a person -> the failed step it is about
        self._given_up: set[str] = set()  # failed steps the ladder's fail rung was journaled for (once each)
        self._open_calls: list[_OpenCall] = []  # the loop's model calls in flight (a re-plan beside the planner)
        self._book = ReferenceBook(options.context_limits)  # finished outputs by reference, summarised once each
        self.report = ""  # the run's report: the planner's notes, rewritten by a {"report": ...} line of a reply
        self._report_journaled = ""
        if options.context == "references" and "context.read" not in tools and isinstance(tools, Toolbox):
            self.tools = tools.merged({"context.read": context_read_tool(lambda rid: self.engine.get(rid).outputs)})
        if options.context == "references" and isinstance(self.tools, Toolbox) and "llm" in self.tools:
            # `llm` steps see the outputs they refer to by reference too, and may read their detail.
            given, wrapped = self.tools, referencing_llm_tool(self.tools["llm"], self.engine.get, self._describe)
            self.tools = Toolbox({n: wrapped if n == "llm" else t for n, t in given.items()})
            self.tools.on_close(given.aclose)  # what the given toolbox holds open is closed with this one
        self._via_tools = plans_via_tools(options.plan_via, client)
        drafting = draft_options(options.draft)
        self._draft = None if drafting is None else DraftPlanner(
            drafting, self.tools, engine.clock, budget=budget, planner=client,
            planner_max_tokens=options.plan_max_tokens)
        if self._draft is not None:  # a verified draft attempt answers its step's call (planning/draft.py)
            self.tools = self._draft.wrap()

    # -- the whole loop -------------------------------------------------------------------------------------------
    async def run(self, goal: str, *, run_id: str | None = None) -> RunResult:
        """Plan and execute ``goal``; return the run's result (its summary carries answer, tokens, cost, versions)."""
        run = await self.start(goal, run_id=run_id)
        return await run.wait()

    async def start(self, goal: str, *, run_id: str | None = None, priority: float = 0.0) -> Run:
        """Start planning ``goal``: return the run at once; the loop drives it in the engine's task group.
        ``priority`` orders its model calls (planner, joiner, ``llm`` steps) at shared endpoints (journaled).
        A loop drives one run: a second :meth:`start` or :meth:`resume` raises RuntimeError."""
        if self._run is not None:
            raise RuntimeError(f"this planning loop drives run '{self._run.id}' already: build one loop per run")
        capacities = {self._model_resource: self.options.model_capacity} if self.options.model_capacity else {}
        run = await self.engine.start(PlanSpec(steps=(), goal=goal, capacities=capacities), tools=self.tools,
                                      run_id=run_id, hold=True, source="goal", priority=priority,
                                      limits=self._journaled_limits())
        self._bind(run)
        run.subscribe(self._on_event())
        self.engine.spawn(self._drive(goal), name=f"planweave-planner-{run.id}")
        return run

    async def resume(self, run_id: str, *, retry_unknown: bool = False) -> Run:
        """Resume an interrupted goal run and drive it again: finished work is kept, failures are repaired, the joiner
        answers. A plan the planner had not finished writing (the interruption cut its stream, or a repair of its
        rejected lines) is finished first: the planner is asked again, shown the steps it had written and what they
        did, and the steps it adds run. Re-plans in flight are asked again: on a failure not repaired, on an
        observation not re-planned on (:func:`_unanswered_observations`). A finished step is never run again."""
        if self._run is not None:
            raise RuntimeError(f"this planning loop drives run '{self._run.id}' already: build one loop per run")
        run = await self.engine.resume(run_id, tools=self.tools, retry_unknown=retry_unknown, hold=True)
        self._bind(run)
        run.subscribe(self._on_event())
        written = plan_written(run.state)
        self._planning = not written
        if self.cascade is not None:  # the planner goes on at the tier it had escalated to
            self.cascade.restore(run.id, run.state.escalations)
        goal = run.plan.spec.goal
        self._questions = {e["question"]: e["step"] for e in run.state.escalations
                           if e.get("rung") == "human" and e.get("question") in run.state.records}
        self._replans = _journaled_replans(run)
        self.report = self._report_journaled = next(
            (str(c["report"]) for c in reversed(run.state.model_calls) if isinstance(c.get("report"), str)), "")
        self._given_up = {s for e in run.state.escalations if e.get("rung") == "fail" for s in e.get("steps", ())}
        for sid, rec in run.state.records.items():  # failures not repaired (nor given up) before the interruption
            if rec.status == "failed" and sid not in self._questions.values() and sid not in self._given_up:
                self._triggers.append(_Trigger("failure", sid, str(rec.error)))
        for qid, sid in self._questions.items():  # answered, but not acted on before the interruption
            if run.state.records[qid].status in ("succeeded", "failed") and _failed(run, sid):
                self._triggers.append(_Trigger("human", sid, qid))
        for sid in _unanswered_observations(run.state):  # their re-plan was in flight: asked again
            self._triggers.append(_Trigger("observation", sid, f"observation '{sid}' arrived"))
        self.engine.spawn(self._drive(goal, plan=not written), name=f"planweave-planner-{run.id}")
        return run

    def _bind(self, run: Run) -> None:
        """The run this loop drives, from now on (its triggers, re-plans and report are this run's)."""
        self._run = run

    @property
    def _active(self) -> Run:
        """The run this loop drives (it is bound by :meth:`start` or :meth:`resume`, before any method needs it)."""
        if self._run is None:
            raise RuntimeError("the planning loop has no run yet: call start() or resume()")
        return self._run

    @property
    def active_run(self) -> Run | None:
        """The run this loop drives, once :meth:`start` or :meth:`resume` began it (None before)."""
        return self._run

    def _journaled_limits(self) -> LimitsRecord | None:
        """The run's limits as ``run_created`` journals them, with all a resume needs to plan the same way: the
        planner's tier table and whether it cascades or is allocated, what the planner sees of the run and whether
        its steps may say ``tool: plan`` (not a later default), the deadline pressure, the parent and the origin."""
        if self.limits is None:
            return None
        cascade = self.cascade
        return self.limits.journaled(
            self.engine.clock.now(), self.client.model, pressure=self.pressure, parent=self.parent,
            origin=self.origin, tiers=None if cascade is None else cascade.table.to_mapping(),
            cascade=cascade is not None, planner=None if cascade is None or cascade.mode == "cascade" else cascade.mode,
            context=self.options.context, subplans=SUBPLAN_TOOL in self.tools,
            **(self.endpoint.journaled() if self.endpoint is not None else {}))

    def replan_for_deadline(self, remaining_s: float | None, reason: str) -> bool:
        """Re-plan the run under deadline pressure (``allocate/pressure_watch.py``): ``reason``, which states the
        time left (``remaining_s``), is what the planner is told. False when no re-plan is left to spend (nothing is
        asked then)."""
        if self._replans >= self.options.max_replans or any(t.kind == "deadline" for t in self._triggers):
            return False
        self._triggers.append(_Trigger("deadline", "", reason))
        self._wake.set()
        return True

    async def _drive(self, goal: str, *, plan: bool = True) -> None:
        """Drive the run until the loop is over, or until the run ends under it (cancelled by a person or another
        process, a server's deadline, :meth:`Run.fail`): the loop does not outlive its run, and never calls the model
        for a run that is over. (An engine closing cancels this task itself: see :meth:`Engine.spawn`.)"""
        run = self._active
        work = asyncio.create_task(self._drive_run(goal, plan=plan))
        over = asyncio.create_task(_ended(run))
        try:
            await asyncio.wait({work, over}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, over):
                task.cancel()
            await asyncio.gather(work, over, return_exceptions=True)

    async def _drive_run(self, goal: str, *, plan: bool) -> None:
        run = self._active
        timeout = self.options.deadline_s
        try:
            async with asyncio.timeout(timeout):
                if plan:
                    await self._plan_and_react(goal)
                else:
                    await self._react(goal)
        except TimeoutError:
            run.cancel(f"deadline of {timeout:g}s reached; stopped with what was done")
        except BudgetExceeded as exc:  # the budget decided: a failure to report, not a cancellation
            run.record("escalation", {"rung": "fail", "reason": f"stopped by its budget: {exc}"})
            run.fail(f"stopped by its budget: {exc}")
        except ModelError as exc:
            if run.finished:
                return
            why = f"the model failed: {exc}{_model_hint(exc)}"
            run.record("escalation", {"rung": "fail", "reason": why})
            if not run.state.records:  # nothing planned, nothing to salvage: a failure, not a cancellation
                run.fail(f"no plan: {why}")
        except Exception as exc:  # a bug here must end this run visibly, not take the engine down
            if not run.finished:
                run.record("escalation", {"rung": "fail", "reason": f"internal error: {type(exc).__name__}: {exc}"})
                run.cancel(f"the planning loop crashed: {type(exc).__name__}: {exc}")
        finally:
            if not run.finished:
                run.release()

    @property
    def _model_resource(self) -> str:
        return f"model:{self.client.model}"

    def _claim_model(self, step: dict[str, Any]) -> dict[str, Any]:
        """An ``llm`` step waits for a model slot in the engine's scheduler (visible, prioritised), not inside the
        client while holding a concurrency slot."""
        if self.options.model_capacity is None or step.get("tool") != "llm":
            return step
        given = step.get("resources")
        resources: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
        return {**step, "resources": {**resources, self._model_resource: 1}}

    def _summary(self, *, join: bool = False) -> str:
        """The run's state as the model is told it, with the engine's secrets hidden: the live run holds them as
        written (outputs, plan steps, errors). ``join``: for the joiner, which is shown the report but cannot
        rewrite it."""
        run = self._active
        hide = self.engine.redact
        # Outputs redacted before a context cuts them short: a secret cut in two is not redacted whole after.
        outputs = run.outputs if hide is None else RedactedOutputs(run.outputs, hide)
        if self.options.context == "references":
            summary = bounded_context(run.state, outputs, self._book, self.report, redact=hide, rewrite=not join)
        else:
            summary = prompts.state_summary(run.state, outputs, budget_chars=self.options.summary_chars)
        return summary if hide is None else str(hide(summary))

    def _describe(self, run_id: str, sid: str) -> str:
        """Step ``sid``'s reference (id, tool, size, summary) for an ``llm`` step's prompt: the one the planner is
        shown, cached per output, summarised from the redacted output."""
        run = self.engine.get(run_id)
        hide = self.engine.redact
        outputs = run.outputs if hide is None else RedactedOutputs(run.outputs, hide)
        return self._book.note(sid, run.plan.steps[sid].tool, outputs.get(sid)).line().removeprefix("- ")

    def _system(self) -> str:
        return prompts.planner_system(self.tools.values(), report=self.options.context == "references",
                                      via_tools=self._via_tools)

    def _in_text(self, messages: list[Message]) -> list[Message]:
        """``messages`` asking for JSON Lines: the draft model writes text (it is offered no function), whatever the
        planner is asked."""
        if not self._via_tools or not messages or messages[0].role != "system":
            return messages
        text = prompts.planner_system(self.tools.values(), report=self.options.context == "references")
        return [Message("system", text), *messages[1:]]

    def _plan_lines(self, sids: list[str]) -> str:
        """Steps ``sids`` of the live plan as the planner's JSON Lines, with the engine's secrets hidden."""
        run = self._active
        hide = self.engine.redact
        lines = []
        for sid in sids:
            obj: Any = run.plan.steps[sid].model_dump(mode="json", exclude_defaults=True)
            lines.append(json.dumps(obj if hide is None else hide(obj), separators=(",", ":")))
        return "\n".join(lines)

    def _restored(self, step: dict[str, Any]) -> dict[str, Any]:
        """``step`` with the live plan's arguments when the model restated a step (same id and tool) with the
        arguments it was shown (its secrets as ``***``); any other step as written: the model can keep a secret in
        the step that had it, never move it to another step or tool."""
        run = self._active
        hide, sid = self.engine.redact, step.get("id")
        live = run.plan.steps.get(sid) if hide is not None and isinstance(sid, str) else None
        if hide is None or live is None or live.tool != step.get("tool"):
            return step
        args = live.model_dump(mode="json", include={"args"}).get("args", {})
        return {**step, "args": args} if args != step.get("args") and hide(args) == step.get("args") else step

    async def _plan_and_react(self, goal: str) -> None:
        """Write the initial plan while reacting to triggers: failures are repaired while the planner still writes."""
        try:
            async with asyncio.TaskGroup() as tg:
                reactor = tg.create_task(self._react(goal))
                try:
                    await self._initial_plan(goal)
                finally:
                    self._planning = False
                    self._wake.set()
                await reactor
        except BaseExceptionGroup as group:  # one of the two failed: report its error, not the group
            raise _first_error(group) from None

    def _on_event(self) -> Callable[[Event], None]:
        run = self._active
        def listen(event: Event) -> None:
            kind, sid = event.kind, event.step
            if sid is None:
                if kind == "run_cancelled":  # charge the loop's cut calls now, before the run reports its spend
                    for call in list(self._open_calls):
                        self._charge_cut(call, "run stopped")
            elif sid in self._questions:  # a person answered (or the question failed): act on it
                if kind == "step_succeeded" or (kind == "step_failed" and event.data.get("final")):
                    self._triggers.append(_Trigger("human", self._questions[sid], sid))
            elif kind == "step_failed" and event.data.get("final"):
                self._triggers.append(_Trigger("failure", sid, str(event.data.get("error"))))
            elif kind == "step_succeeded" and sid in run.plan.steps:
                step = run.plan.steps[sid]
                if step.observe:
                    self._triggers.append(_Trigger("observation", sid, f"observation '{sid}' arrived"))
                if step.verifies is not None:
                    out = run.outputs.get(sid)
                    if isinstance(out, Mapping) and out.get("ok") is False:
                        self._triggers.append(_Trigger(
                            "verifier", step.verifies, f"verifier '{sid}' rejected '{step.verifies}': "
                            f"{out.get('reason', 'no reason given')}"))
                        self._planner_signal("rejected", str(out.get("reason", "no reason given")),
                                             key=f"verifier step '{sid}'")
            self._wake.set()

        return listen

    async def _react(self, goal: str) -> None:
        run = self._active
        while True:
            trigger = self._next_trigger()
            if trigger is None:
                if run.state.active == 0 and not self._planning:
                    if await self._exhausted(goal):
                        return
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            if trigger.kind == "human":
                if not self._act_on_answer(trigger):
                    return  # the person chose to abort
                continue
            if self.options.synchronous:
                await self._until_idle()
            if trigger.kind in ("observation", "deadline") or not self.options.local_repair:
                # Whole-plan re-planning needs the whole plan: wait until the planner has finished writing it.
                await self._until_planned()
            if trigger.kind == "observation":
                await self._replan(goal, f"{trigger.reason}", trigger="observation", final=True)
                continue
            if trigger.kind == "deadline":
                await self._replan(goal, trigger.reason, trigger="deadline_pressure")
                continue
            # Failures that happened meanwhile are repaired together: their regions may overlap or feed each other.
            batch = [trigger, *self._take_failures()]
            if not self.options.local_repair or any(t.step in self._repaired for t in batch):
                await self._until_planned()
                await self._escalate_global(goal, batch)
            else:
                await self._local_repair(goal, batch)

    def _take_failures(self) -> list[_Trigger]:
        run = self._active
        taken = [t for t in self._triggers if t.kind not in _DEFERRED
                 and (t.kind != "failure" or _failed(run, t.step))]
        self._triggers = [t for t in self._triggers if t.kind in _DEFERRED]
        return taken

    def _next_trigger(self) -> _Trigger | None:
        run = self._active
        while self._triggers:
            trig = self._triggers.pop(0)
            rec = run.state.records.get(trig.step)
            if trig.kind == "failure" and (rec is None or rec.status != "failed"):
                continue  # already replaced by a newer plan version
            return trig
        return None

    async def _until_idle(self) -> None:
        """Wait until the plan is written and no step runs (the synchronous re-planner's rule)."""
        run = self._active
        while run.state.active or self._planning:
            self._wake.clear()
            await self._wake.wait()

    async def _until_planned(self) -> None:
        while self._planning:
            self._wake.clear()
            await self._wake.wait()

    async def _exhausted(self, goal: str) -> bool:
        """The plan ran out: answer, or re-plan. Returns True when the loop is over."""
        run = self._active
        failed = [r.id for r in run.state.records.values() if r.status == "failed"]
        if failed and self._replans >= self.options.max_replans:
            fresh = [sid for sid in failed if sid not in self._given_up]
            if fresh:  # the ladder already journaled its fail rung for the others
                self._record_fail(fresh, f"re-plan limit ({self.options.max_replans}) reached")
            return True
        if not self.options.join:
            return True
        summary = self._summary(join=True)
        completion = await self._call("join", [Message("user", prompts.join_prompt(goal, summary))],
                                      max_tokens=self.options.join_max_tokens,
                                      floor_tokens=self.options.join_min_tokens, schema=prompts.JOIN_SCHEMA)
        decision = completion.parsed if isinstance(completion.parsed, Mapping) else _loads(completion.text)
        answer = decision.get("answer") if isinstance(decision, Mapping) else None
        if isinstance(answer, str) and answer.strip():
            run.record("answer", {"text": answer})
            return True
        reason = decision.get("replan") if isinstance(decision, Mapping) else None
        if self._replans >= self.options.max_replans:
            run.record("escalation", {"rung": "fail", "reason": f"no answer and the re-plan limit "
                                                                f"({self.options.max_replans}) is reached"})
            return True
        await self._replan(goal, str(reason or "the plan ran out without an answer"), trigger="joiner",
                           final=True)
        return False

    # -- planning -----------------------------------------------------------------------------------------------
    async def _initial_plan(self, goal: str) -> None:
        """Write the initial plan; in a resumed run whose planner was cut off, finish the plan it had begun."""
        run = self._active
        recalled = "" if self.recall is None else await self.recall(goal)
        messages = [Message("system", self._system()),
                    Message("user", prompts.initial_prompt(goal, memory=recalled))]
        initial = run.state.versions[0] if run.state.versions else None  # the version the run was created with
        version = run.plan.version if initial is None else int(initial["version"])
        written = [] if initial is None else [sid for sid in initial["added"]
                                              if sid in run.plan.steps and sid not in self._questions]
        known: frozenset[str] = frozenset()
        if written:  # the lines it had written are its own answer so far; the state says what they did
            messages += [Message("assistant", self._plan_lines(written)),
                         Message("user", prompts.continue_prompt(goal, self._summary()))]
            # A line restating a step the run has (or a later version dropped) is taken as restated, never added
            # twice: the plan may have moved on since the planner wrote it (a repair, a person's answer).
            known = frozenset({*run.state.records, *(rec.id for _, rec in run.state.retired)})
        accepted: list[str] = []
        first_started = self.engine.clock.now()
        draft: DraftSession | None = None if self._draft is None else self._draft.begin(run, self._in_text(messages))
        try:
            await self._initial_lines(messages, version, accepted, first_started, draft, known)
        finally:
            if draft is not None:
                draft.main_done()

    async def _initial_lines(self, messages: list[Message], version: int, accepted: list[str],
                             first_started: float, draft: DraftSession | None, known: frozenset[str]) -> None:
        run = self._active
        for attempt in range(self.options.max_repairs + 1):
            errors: list[str] = []
            started = self.engine.clock.now()

            held: list[tuple[dict[str, Any], str]] = []

            def admit_now(obj: dict[str, Any], where: str, _started: float = started,
                          _errors: list[str] = errors) -> None:
                if self._already_planned(obj) or obj.get("id") in known:
                    return  # a repair (or a resumed planner) restating a line it wrote already: nothing to do
                if draft is not None:  # verified before the step exists: its draft attempt is its own at once
                    draft.main_step(obj)
                try:
                    accepted.extend(run.extend([self._claim_model(obj)], version=version, trigger="initial",
                                               model_started_at=_started))
                except PlanInvalid as exc:
                    _errors.extend(f"{where}: {p}" for p in exc.problems)
                    if draft is not None:
                        draft.main_rejected()

            def admit(steps: tuple[dict[str, Any], ...], where: str,
                      _held: list[tuple[dict[str, Any], str]] = held) -> None:
                for obj in steps:
                    if self.options.stream_admission:
                        admit_now(obj, where)
                    else:
                        _held.append((obj, where))

            completion = await self._stream_lines("plan", messages, admit, errors)
            for obj, where in held:  # whole-plan mode: admit only once the model has finished
                admit_now(obj, where)
            if not errors or attempt == self.options.max_repairs:
                # The plan is written: its end journaled after its last line, so a resume that finds it does not ask
                # again (plan_written), and one that does not (killed mid-stream, or before a repair) finishes it.
                run.extend([], version=version, trigger="initial", model_started_at=first_started,
                           model_finished_at=self.engine.clock.now())
            if not errors:
                self._planner_signal("succeeded")
                return
            messages = [*messages, Message("assistant", _answer(completion)),
                        Message("user", prompts.repair_lines_prompt(errors, accepted, via_tools=self._via_tools))]
            run.record("escalation", {"rung": "repair_lines", "reason": "; ".join(errors)[:2000],
                                      "attempt": attempt + 1})
            self._planner_signal("failed", "; ".join(errors))

    async def _stream_lines(
        self, purpose: str, messages: list[Message],
        admit: Callable[[tuple[dict[str, Any], ...], str], None], errors: list[str],
    ) -> Completion:
        """One planner call: its steps admitted as each JSON line (text) or ``add_step`` call (tools) completes;
        lines and calls that are not steps are added to ``errors`` for the repair prompt."""
        parser, calls = LineParser(), StepCalls()

        def take(lines: list[Line]) -> None:
            for line in lines:
                if line.error:
                    errors.append(line.error)
                else:
                    self._admit_or_note(line.steps, line.where, admit)

        def feed(text: str) -> None:
            take(parser.feed(text))

        def feed_call(delta: ToolCallDelta) -> None:
            take(calls.feed(delta))

        tools = planner_tools(self.tools, report=self.options.context == "references") if self._via_tools else ()
        try:
            completion = await self._call(purpose, messages, max_tokens=self.options.plan_max_tokens,
                                          floor_tokens=self.options.plan_min_tokens, on_text=feed,
                                          tools=tools, on_tool=feed_call)
        except ProviderError as exc:
            # An endpoint without tool calls refuses the request before writing anything: plan in text from now on.
            if not (tools and self.options.plan_via == "auto" and exc.status in _TOOLS_REFUSED
                    and parser.step_lines == calls.step_calls == 0 and not errors):
                raise
            self._via_tools = False
            self._active.record("escalation", {"rung": "plan_via_text", "reason": f"tool calls refused: {exc}"[:500]})
            messages[0] = Message("system", self._system()) if messages[0].role == "system" else messages[0]
            return await self._stream_lines(purpose, messages, admit, errors)
        take(calls.close(completion.tool_calls))
        take(parser.close())
        if parser.step_lines == 0 and calls.step_calls == 0 and not errors:  # prose only: not a plan
            errors.append(NO_STEP_LINE)  # (an empty plan is written `[]`)
        return completion

    def _admit_or_note(self, steps: tuple[dict[str, Any], ...], where: str,
                       admit: Callable[[tuple[dict[str, Any], ...], str], None]) -> None:
        """Admit a line's steps; a ``{"report": "..."}`` object (references context) rewrites the run's report
        instead (journaled with the model call that wrote it)."""
        if self.options.context == "references":
            notes = [s for s in steps if set(s) == {"report"} and isinstance(s["report"], str)]
            if notes:
                self.report = notes[-1]["report"]
                steps = tuple(s for s in steps if not (set(s) == {"report"} and isinstance(s["report"], str)))
                if not steps:
                    return
        admit(steps, where)

    async def _propose(self, purpose: str, messages: list[Message],
                       keep: Callable[[frozenset[str]], list[dict[str, Any]]], trigger: str) -> bool:
        """Ask for a proposal, splice it in; repair invalid ones and re-request stale ones (bounded). ``keep(ids)``:
        the live steps the proposal keeps beside the ones it writes (``ids``), read when it arrives.

        With a draft model (planning/draft.py) the model's first answer is drafted too: verified draft attempts are
        kept only if that answer is the proposal spliced in."""
        run = self._active
        draft = None if self._draft is None else self._draft.begin_replan(run, self._in_text(messages))
        spliced = False
        try:
            spliced = await self._propose_lines(purpose, messages, keep, trigger, draft)
            return spliced
        finally:
            if draft is not None:
                if spliced:
                    draft.main_done()
                else:
                    draft.abandon("the re-plan was not spliced in")

    async def _propose_lines(self, purpose: str, messages: list[Message],
                             keep: Callable[[frozenset[str]], list[dict[str, Any]]], trigger: str,
                             draft: DraftSession | None) -> bool:
        run = self._active
        stale_left = self.options.max_stale_retries
        for _attempt in range(self.options.max_repairs + 1 + self.options.max_stale_retries):
            seen = run.position
            started = self.engine.clock.now()
            steps: list[dict[str, Any]] = []
            errors: list[str] = []
            if draft is not None and _attempt:  # asked again: the drafted answer was not taken
                draft.abandon("the re-plan was asked again")
                draft = None
            collect = _collector(steps) if draft is None else _drafting(_collector(steps), draft)
            completion = await self._stream_lines(purpose, messages, collect, errors)
            finished = self.engine.clock.now()
            if not errors:
                if run.finished:
                    return False
                ids = {s.get("id") for s in steps}
                # What to keep is read when the proposal arrives: steps streamed in meanwhile stay.
                written = [self._claim_model(self._restored(s)) for s in steps]
                proposal = {"steps": [*[k for k in keep(frozenset(i for i in ids if isinstance(i, str)))
                                        if k["id"] not in ids], *written]}
                try:
                    run.propose(proposal, trigger=trigger, seen=seen, max_staleness=self.options.max_staleness,
                                model_started_at=started, model_finished_at=finished)
                    self._planner_signal("succeeded")
                    return True
                except StaleProposal as exc:
                    stale_left -= 1
                    run.record("escalation", {"rung": "stale", "reason": str(exc)})
                    if stale_left < 0:
                        return False
                    summary = self._summary()
                    again = f"That plan is stale: {exc}. The state now:\n{summary}\nWrite the remaining plan again."
                    messages = [*messages, Message("assistant", _answer(completion)), Message("user", again)]
                    continue
                except PlanInvalid as exc:
                    errors.extend(str(p) for p in exc.problems)
            run.record("escalation", {"rung": "repair_lines", "reason": "; ".join(errors)[:2000]})
            self._planner_signal("failed", "; ".join(errors))
            messages = [*messages, Message("assistant", _answer(completion)),
                        Message("user", prompts.repair_lines_prompt(errors, [], via_tools=self._via_tools))]
        return False

    def _remaining(self, exclude: set[str]) -> list[dict[str, Any]]:
        """The steps still to do, as step objects, minus ``exclude``: waiting or running ones (also those waiting for
        a person), and ones skipped because of a failure (restating them revives them once the repair replaced what
        they wait for)."""
        run = self._active
        return [
            run.plan.steps[sid].model_dump(exclude_defaults=True)
            for sid, rec in run.state.records.items()
            if rec.status in _REMAINING and sid not in exclude
        ]

    def _already_planned(self, obj: dict[str, Any]) -> bool:
        run = self._active
        sid = obj.get("id")
        existing = run.plan.steps.get(sid) if isinstance(sid, str) else None
        if existing is None:
            return False
        try:
            return parse_step(self._claim_model(obj)) == existing
        except PlanInvalid:
            return False

    def _region(self, sid: str) -> list[str]:
        """A step and everything downstream of it in the current plan."""
        run = self._active
        if sid not in run.plan.steps:
            return []
        seen, stack = [sid], [sid]
        while stack:
            for child in run.plan.dependents[stack.pop()]:
                if child not in seen:
                    seen.append(child)
                    stack.append(child)
        return seen

    def _spend_replan(self) -> bool:
        """Count one re-plan; False when the limit is reached (the caller climbs to the last rung)."""
        if self._replans >= self.options.max_replans:
            return False
        self._replans += 1
        return True

    def _limit_reached(self, reason: str) -> str:
        return f"re-plan limit ({self.options.max_replans}) reached: {reason}"

    def _batch_region(self, batch: list[_Trigger]) -> list[str]:
        """The failed steps of ``batch`` and everything downstream of them in the plan *now*."""
        region: list[str] = []
        for trig in batch:
            region.extend(s for s in self._region(trig.step) if s not in region)
        return region

    async def _local_repair(self, goal: str, batch: list[_Trigger]) -> None:
        """Ask for replacements of the failed region; splice them in with the rest of the plan.

        The region's steps the repair does not restate are dropped (the prompt says so): a repair may keep, rename
        or merge them. The region is read again when the proposal arrives: a step the planner streamed in after the
        prompt was sent is dropped when it waits on a step the repair dropped (it would make the proposal stale), and
        kept when what it waits on is restated under its id (it is the initial plan's, not the repair's to drop).
        """
        run = self._active
        region = self._batch_region(batch)
        reason = "; ".join(f"{t.step}: {t.reason}" for t in batch)
        if not self._spend_replan():
            self._last_rung(batch, self._limit_reached(reason))
            return
        for trig in batch:
            run.record("escalation", {"rung": "local_repair", "reason": trig.reason, "region": region},
                       step=trig.step)
        self._repaired.update(region)
        summary = self._summary()
        failed = [t.step for t in batch]
        messages = [Message("system", self._system()),
                    Message("user", prompts.repair_region_prompt(goal, summary, failed, reason, region))]
        if not await self._propose("local_repair", messages,
                                   lambda ids: self._remaining(self._repair_drops(batch, region, ids)),
                                   trigger="local_repair"):
            await self._escalate_global(goal, batch)

    def _repair_drops(self, batch: list[_Trigger], asked: list[str], restated: frozenset[str]) -> set[str]:
        """What a local repair of ``batch`` drops when its proposal (restating ``restated``) lands: the region it was
        asked to replace (``asked``), and the steps that joined the region since, unknown to the repair, that wait on
        a step it dropped (through ``after`` or a reference)."""
        run = self._active
        dropped = set(asked) - restated
        late = [s for s in self._batch_region(batch) if s not in asked and s not in restated]
        grew = True
        while grew:  # a region lists a step before the steps downstream of it, but a step may wait on several
            grew = False
            for sid in late:
                if sid not in dropped and any(d in dropped for d in run.plan.deps.get(sid, ())):
                    dropped.add(sid)
                    grew = True
        return dropped | set(asked)

    async def _escalate_global(self, goal: str, batch: list[_Trigger]) -> None:
        run = self._active
        for trig in batch:
            run.record("escalation", {"rung": "global_replan", "reason": trig.reason}, step=trig.step)
        why = await self._replan(goal, "; ".join(f"{t.step}: {t.reason}" for t in batch),
                                 trigger="global_replan")
        if why is not None:
            self._last_rung(batch, why)

    async def _replan(self, goal: str, reason: str, *, trigger: str, final: bool = False) -> str | None:
        """Re-plan the whole remaining plan; None when a new version landed, else why not (the caller fails with it,
        or, with ``final``, it is journaled as the ``fail`` rung here)."""
        run = self._active
        why: str | None = None
        if not self._spend_replan():
            why = self._limit_reached(reason)
        else:
            summary = self._summary()
            messages = [Message("system", self._system()),
                        Message("user", prompts.replan_prompt(goal, summary, reason))]
            if not await self._propose("replan", messages, lambda _ids: [], trigger=trigger):
                why = f"no usable plan after: {reason}"
        if why is not None and final:
            run.record("escalation", {"rung": "fail", "reason": why})
        return why

    # -- the last rung: a person decides --------------------------------------------------------------------------
    def _last_rung(self, batch: list[_Trigger], why: str) -> None:
        """The ladder is exhausted for ``batch``: ask a person about each failed step (``ask_human``), else fail."""
        run = self._active
        failed = [t.step for t in batch if t.kind == "failure" and _failed(run, t.step)]
        if not (self.options.ask_human and failed):
            self._record_fail(failed, why)
            return
        for sid in failed:
            qid = _fresh_id(run, f"{sid}_ask")
            self._questions[qid] = sid
            run.record("escalation", {"rung": "human", "reason": why, "question": qid}, step=sid)
            prompt = prompts.human_question(sid, str(run.state.records[sid].error), why)
            run.extend([{"id": qid, "tool": "human.input",
                         "args": {"prompt": _literal(prompt), "schema": prompts.HUMAN_SCHEMA}}], trigger="human")

    def _record_fail(self, failed: list[str], why: str) -> None:
        """Journal the ladder's ``fail`` rung for the failed steps ``failed`` (named in ``steps``: counted once, also
        by a resumed loop)."""
        run = self._active
        self._given_up.update(failed)
        run.record("escalation", {"rung": "fail", "reason": why, "steps": failed})

    def _act_on_answer(self, trigger: _Trigger) -> bool:
        """Apply a person's answer about a failed step: retry or skip it (a new plan version), or abort (False: the
        run is ended failed at once, see :meth:`_end_failed`)."""
        run = self._active
        sid, qid = trigger.step, trigger.reason
        answer = run.outputs.get(qid) if run.state.records[qid].status == "succeeded" else None
        action = answer.get("action") if isinstance(answer, Mapping) else None
        if action not in ("retry", "skip"):
            why = "a person chose to abort" if action == "abort" else \
                f"question '{qid}' got no answer: {run.state.records[qid].error}"
            self._end_failed(sid, why)
            return False
        if not _failed(run, sid):
            return True  # a repair replaced the step meanwhile: the answer no longer applies
        steps = self._retried(sid) if action == "retry" else self._skipped(sid, qid)
        try:
            run.propose({"steps": steps}, trigger=f"human_{action}", question=qid)
        except (PlanInvalid, StaleProposal) as exc:  # stale: the state changed under the answer
            self._end_failed(sid, f"the person's {action} could not be applied: {exc}")
            return False
        return True

    def _end_failed(self, sid: str, why: str) -> None:
        """The last rung decided for failed step ``sid``: journal the ``fail`` rung and end the run failed now.

        Other branches are cancelled rather than left to run on (a person who aborts wants the run to stop), and
        the decision is final: the run cannot be resumed (:meth:`Run.fail`).
        """
        run = self._active
        run.record("escalation", {"rung": "fail", "reason": f"step '{sid}': {why}"}, step=sid)
        rec = run.state.records.get(sid)
        error = f": {rec.error}" if rec is not None and rec.error else ""
        run.fail(f"step '{sid}' failed{error}; {why}")

    def _retried(self, sid: str) -> list[dict[str, Any]]:
        """The remaining plan with failed step ``sid`` restated as it was: it runs again, its dependents after it."""
        run = self._active
        return [run.plan.steps[sid].model_dump(exclude_defaults=True), *self._remaining({sid})]

    def _skipped(self, sid: str, qid: str) -> list[dict[str, Any]]:
        """The remaining plan without failed step ``sid``: what referred to it refers to the answer's ``value``
        (``${sid.x}`` becomes ``${qid.value.x}``) and waits for the question ``qid`` instead."""
        steps = []
        for obj in self._remaining({sid}):
            after = [qid if a == sid else a for a in obj.get("after", ())]
            steps.append({**obj, "args": rename_refs(obj.get("args", {}), {sid: f"{qid}.value"}),
                          **({"after": after} if after else {})})
        return steps

    # -- one model call, budgeted and journaled --------------------------------------------------------------------
    async def _call(
        self, purpose: str, messages: list[Message], *, max_tokens: int, floor_tokens: int,
        schema: Mapping[str, Any] | None = None, on_text: Callable[[str], None] | None = None,
        tools: tuple[ToolSpec, ...] = (), on_tool: Callable[[ToolCallDelta], None] | None = None,
    ) -> Completion:
        """Call the model within the budget: wait for room, the reply lowered down to ``floor_tokens`` when nothing
        in flight can free more; the reservation is settled the moment the call ends, a cut stream charged (and
        journaled) for what it had cost."""
        run = self._active
        if self.cascade is not None:  # an allocated planner decides its tier for this call here
            await self.cascade.choose(run, purpose)
        model = self.cascade.model(run.id) if self.cascade is not None else self.client.model
        request = CompletionRequest(messages=tuple(messages), max_tokens=max_tokens, schema=schema,
                                    model=None if self.cascade is None else model, tools=tools)
        prices = getattr(self.client, "prices", None)
        reservation, reservation_id = None, None
        if self.budget is not None:
            table = prices if isinstance(prices, PriceTable) else _NO_PRICES
            usd, tokens = worst_case(request, model, table)
            price = table.lookup(model)
            reservation, request = await acquire_call(self.budget, request, usd or 0.0, tokens,
                                                      floor_tokens=floor_tokens,
                                                      usd_per_token=None if price is None else price.output / 1e6)
            reservation_id = await _journal_reservation(run, self.budget, reservation, purpose, model)
        # The planner's and joiner's calls hold up the whole run: queued at its priority with no slack.
        call = CallClass(priority=run.priority, slack=0.0, run_id=run.id, purpose=purpose)
        open_call = _OpenCall(purpose, self.engine.clock.now(), StreamMeter(approx_prompt_tokens(
            m.content for m in messages)), reservation, model=request.model, reservation_id=reservation_id)
        self._open_calls.append(open_call)
        try:
            with call_context(call):
                if on_text is None:
                    completion = await self.client.complete(request)
                else:
                    completion = await _consume(self.client.stream(request), on_text, open_call.meter, on_tool)
        except BaseException as exc:
            self._charge_cut(open_call, type(exc).__name__)
            raise
        finally:
            self._open_calls.remove(open_call)
        if reservation is not None and self.budget is not None:
            self.budget.settle(reservation, completion.cost_usd or 0.0, completion.total_tokens)
        self._journal_call(purpose, open_call.started, model=completion.model,
                           usage=Usage(completion.prompt_tokens, completion.completion_tokens,
                                       completion.usage_source), cost=completion.cost_usd,
                           reservation=open_call.reservation_id,
                           via=None if on_text is None else "tools" if tools else "text")
        return completion

    def _planner_signal(self, kind: SignalKind, detail: str = "", *, key: str = "") -> None:
        """Tell the planner's cascade (if any) what its plan did: its next call may run on another tier."""
        run = self._active
        if self.cascade is not None:
            self.cascade.observe(run, Signal(kind, self.engine.clock.now(), key=key, detail=detail[:2000]))

    def _charge_cut(self, call: _OpenCall, cut: str) -> None:
        """End a call that did not finish, once: a stream that yielded anything is charged (and journaled, marked
        ``cut``) for what it had cost; one that yielded nothing frees its reservation."""
        run = self._active
        if call.ended:
            return
        call.ended = True
        if not call.meter.received:
            if call.reservation is not None and self.budget is not None:
                self.budget.release(call.reservation)
            if call.reservation_id is not None:
                run.record("model_released", {"reservation": call.reservation_id, "reason": cut})
            return
        usage = call.meter.spent()
        prices = getattr(self.client, "prices", None)
        model = call.model or self.client.model
        cost = prices.cost(model, usage.prompt_tokens, usage.completion_tokens) \
            if isinstance(prices, PriceTable) else None
        if call.reservation is not None and self.budget is not None:
            self.budget.settle(call.reservation, cost or 0.0, usage.total_tokens)
        self._journal_call(call.purpose, call.started, model=model, usage=usage, cost=cost,
                           cut=cut, reservation=call.reservation_id)

    def _journal_call(self, purpose: str, started: float, *, model: str, usage: Usage,
                      cost: float | None, cut: str | None = None, reservation: str | None = None,
                      via: str | None = None) -> None:
        run = self._active
        data: dict[str, Any] = {
            "purpose": purpose, "model": model, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "cost_usd": cost or 0.0, "usage_source": usage.source,
            "started_at": started, "finished_at": self.engine.clock.now(),
            "replans": self._replans,  # spent so far: a resumed loop continues the count (_journaled_replans)
        }
        if cut is not None:
            data["cut"] = cut  # the stream ended early (the exception that ended it): charged for what it sent
        if self.report != self._report_journaled:  # the report this call wrote: a resume reads the last one back
            data["report"] = self._report_journaled = self.report
        if reservation is not None:
            data["reservation"] = reservation  # settles the call's model_reserved
        if via is not None:
            data["plan_via"] = via  # a planner call: offered add_step (tools) or asked for JSON Lines (text)
        run.record("model_call", data)


async def _journal_reservation(run: Run, budget: Budget, reservation: Reservation, purpose: str, model: str) -> str:
    """Journal a planner's or joiner's reserved worst case, durably, before its request goes out (a resume after a
    kill counts it spent: docs/budgets.md); return its id. A failure to write it frees the reservation."""
    call_id = secrets.token_hex(8)
    try:
        await run.sink.record_reservation({"reservation": call_id, "purpose": purpose, "model": model,
                                      "tokens": reservation.tokens, "cost_usd": reservation.usd})
    except BaseException:
        budget.release(reservation)
        with contextlib.suppress(Exception):
            run.record("model_released", {"reservation": call_id, "reason": "not sent"})
        raise
    return call_id


async def _consume(chunks: AsyncIterator[Delta | Completion], on_text: Callable[[str], None],
                   meter: StreamMeter, on_tool: Callable[[ToolCallDelta], None] | None = None) -> Completion:
    completion: Completion | None = None
    async with contextlib.aclosing(chunks) as stream:  # type: ignore[type-var]
        async for chunk in stream:
            if isinstance(chunk, Delta) and chunk.tool_call is not None:
                # a call's arguments are output too: a stream cut in the middle of a call is charged for them
                meter.feed(Delta(chunk.tool_call.arguments, chunk.usage))
                if on_tool is not None:
                    on_tool(chunk.tool_call)
            else:
                meter.feed(chunk)
            if isinstance(chunk, Delta):
                on_text(chunk.text)
            else:
                completion = chunk
    if completion is None:
        raise ModelError("the model stream ended without a completion", model="?", base_url="?")
    return completion


def plans_via_tools(plan_via: PlanVia, client: ModelClient) -> bool:
    """Whether the planner is offered ``add_step`` calls: ``tools`` always, ``text`` never, ``auto`` when ``client``
    speaks a dialect with tool calls (Chat Completions, Responses, Anthropic Messages: the clients of
    :mod:`planweave.models.dialects`, or a client that says ``supports_tools``)."""
    if plan_via != "auto":
        return plan_via == "tools"
    says = getattr(client, "supports_tools", None)
    if isinstance(says, bool):
        return says
    from planweave.models.local import LOCAL_MODEL
    from planweave.models.openai import OpenAIChatClient  # the dialects' clients all build on it

    # ``--model local`` (llama-cpp-python's Gemma chat format) ignores ``tools`` unless one is forced: text there.
    return isinstance(client, OpenAIChatClient) and client.model != LOCAL_MODEL


def _answer(completion: Completion) -> str:
    """A planner's reply as it is shown back to it in a repair: its text, then its tool calls one per line."""
    calls = calls_as_lines(completion.tool_calls)
    return "\n".join(part for part in (completion.text, calls) if part)


def plan_written(state: RunState) -> bool:
    """Whether the planner of goal run ``state`` finished writing its initial plan: the end of its last answer is
    journaled (``model_finished_at`` of the version the run was created with, which only the initial plan's end sets,
    once its last line was admitted). A run interrupted before that has a plan the planner had not finished, which a
    resume finishes first."""
    return bool(state.versions) and state.versions[0].get("model_finished_at") is not None


def _unanswered_observations(state: RunState) -> list[str]:
    """The observation steps of ``state`` whose re-plan never landed (in flight when the run was interrupted): each
    succeeded, and since it did neither a re-plan on an observation was spliced in nor the ladder's ``fail`` rung
    about it journaled."""
    pending = []
    for sid, rec in state.records.items():
        step = state.plan.steps.get(sid)
        done = rec.finished_at
        if step is None or not step.observe or rec.status != "succeeded" or done is None:
            continue
        replanned = any(v.get("trigger") == "observation" and (v.get("spliced_at") or 0.0) >= done
                        for v in state.versions)
        gave_up = any(e.get("rung") == "fail" and f"observation '{sid}' arrived" in str(e.get("reason"))
                      and float(e.get("at") or 0.0) >= done for e in state.escalations)
        if not (replanned or gave_up):
            pending.append(sid)
    return pending


def _journaled_replans(run: Run) -> int:
    """The re-plans a run's planning loop had spent when it last called the model (each call journals the count)."""
    return max((int(c.get("replans", 0)) for c in run.state.model_calls), default=0)


def _model_hint(exc: ModelError) -> str:
    """What to set or pass when the model cannot be used at all (appended to the error), or ``""``."""
    if isinstance(exc, ProviderError) and exc.status in (401, 403):
        return (f". The server at {exc.base_url} refused the API key: set OPENAI_API_KEY (or the variable "
                "--api-key-env names) to a valid key, or pass --base-url URL for a server that needs none")
    if isinstance(exc, (ModelUnavailable, ModelTimeout)):
        return (f". Nothing usable answers at {exc.base_url}: start the model server there, or pass --base-url URL "
                "(or set OPENAI_BASE_URL) for another; a hosted API also needs OPENAI_API_KEY")
    return ""


async def _ended(run: Run) -> None:
    """Return once the run has ended, finished or interrupted."""
    with contextlib.suppress(RunError):
        await run.wait()


_REMAINING = ("pending", "ready", "running", "waiting_approval", "waiting_input", "skipped")


def _failed(run: Run, sid: str) -> bool:
    rec = run.state.records.get(sid)
    return rec is not None and rec.status == "failed"


def _fresh_id(run: Run, base: str) -> str:
    """``base``, or ``base2``, ``base3``... : the first id no step of the plan has."""
    taken, n = run.plan.steps, 2
    if base not in taken:
        return base
    while f"{base}{n}" in taken:
        n += 1
    return f"{base}{n}"


def _literal(text: str) -> str:
    """``text`` as a template argument that means exactly itself (``${`` is written ``$${``)."""
    return text.replace("${", "$${")


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


def _drafting(collect: Callable[[tuple[dict[str, Any], ...], str], None],
              draft: DraftSession) -> Callable[[tuple[dict[str, Any], ...], str], None]:
    """``collect``, telling ``draft`` each main line first (it verifies the draft's lines against them)."""

    def admit(steps: tuple[dict[str, Any], ...], where: str) -> None:
        for obj in steps:
            draft.main_step(obj)
        collect(steps, where)

    return admit


def _collector(into: list[dict[str, Any]]) -> Callable[[tuple[dict[str, Any], ...], str], None]:
    """Collect streamed steps (a re-plan is spliced whole, once the model has finished)."""

    def collect(steps: tuple[dict[str, Any], ...], _where: str) -> None:
        into.extend(steps)


    return collect


def _loads(text: str) -> Any:
    try:
        return json.loads(text.strip().removeprefix("```json").removesuffix("```"))
    except json.JSONDecodeError:
        return None
