"""What the ``llm`` tool asks for a ``model: cascade`` step: the tier of this attempt, and what to do on a fire.

:class:`CascadeSeam` keeps one :class:`~planweave.allocate.cascade.Cascade` per run and cascade key, and one
:class:`~planweave.allocate.monitors.MonitorSet` per step. It is fed two ways: the run's events (through
:meth:`CascadeSeam.bind`, an engine listener: attempts that fail or succeed, progress, a ``verifies:`` step's
``{ok: false}``), and what the tool itself sees of an attempt (:func:`cascaded_call`: the reply's schema check, a
named verifier, the model's confidence, the stream going silent). A fire escalates the step one tier; a streak of
successes de-escalates; each move is journaled as an ``escalation`` event (``rung`` escalate or deescalate, the
``monitor``, ``from_tier``, ``to_tier``). The monitors and the cascade stay pure; the engine's core knows nothing of
any of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from planweave.allocate.cascade import Cascade, Shift
from planweave.allocate.model import AllocationError, TierTable
from planweave.allocate.monitors import (
    MONITORS,
    Fire,
    LowConfidenceMonitor,
    MilestoneMonitor,
    Monitor,
    MonitorSet,
    Signal,
    StuckMonitor,
    logprob_margin,
    reported_confidence,
)
from planweave.allocate.samples import Verifier, output_key
from planweave.core.context import StepContext, current_step
from planweave.core.errors import RunError, ToolError
from planweave.core.events import Event, EventKind
from planweave.core.plan.graph import Plan
from planweave.core.state import RunState

ConfidenceSource = Literal["answer", "logprobs"]
SETTINGS = ("key", "monitors", "failures", "silence_s", "repeats", "min_confidence", "confidence", "streak")
TOP_LOGPROBS = 2  # enough for the margin between the best token and the next


class CascadedRun(Protocol):
    """What the seam reads of a run (``engine.runtime.Run`` is one): its plan, its outputs, a way to journal, and
    its events (when the seam follows runs one by one rather than the whole engine)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def outputs(self) -> Mapping[str, Any]: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...

    def subscribe(self, listener: Callable[[Event], None]) -> None: ...


class CascadeHost(Protocol):
    """The engine as the seam needs it: its runs by id and every event of the runs it starts."""

    def get(self, run_id: str) -> Any: ...

    def subscribe(self, listener: Callable[[Event], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class CascadeArgs:
    """A ``model: cascade`` step's arguments, checked: its tiers (cheap to strong), its cascade key and monitors."""

    tiers: tuple[str, ...]
    key: str
    monitors: tuple[str, ...]
    failures: int | None
    silence_s: float | None
    repeats: int | None
    min_confidence: float
    confidence: ConfidenceSource
    streak: int

    @classmethod
    def parse(cls, table: TierTable, args: Mapping[str, Any], defaults: CascadeArgs | None = None, *,
              step: str, tool: str = "llm") -> CascadeArgs:
        """Check ``tiers`` and the ``cascade:`` settings of a step's args; raise :class:`AllocationError` naming the
        step and the field. The tiers run cheapest first (by the table's ``cost_usd``, ties in the order given)."""
        where = f"step '{step}'"
        ordered = _tiers(table, args.get("tiers"), where)
        given = args.get("cascade")
        if given is None or given is True:
            given = {}
        if not isinstance(given, Mapping):
            raise AllocationError(f"{where}: 'cascade' must be true or a mapping of settings "
                                  f"({', '.join(SETTINGS)}), got {given!r}")
        unknown = sorted(set(given) - set(SETTINGS))
        if unknown:
            raise AllocationError(f"{where}: 'cascade' has unknown setting '{unknown[0]}' (known: "
                                  f"{', '.join(SETTINGS)})")
        base = defaults or DEFAULTS
        key = given.get("key", f"{tool}:{','.join(ordered)}")
        monitors = given.get("monitors", base.monitors)
        if (not isinstance(monitors, list | tuple) or not all(isinstance(m, str) for m in monitors)
                or not set(monitors) <= set(MONITORS)):
            raise AllocationError(f"{where}: 'cascade.monitors' must list some of {', '.join(MONITORS)}, "
                                  f"got {monitors!r}")
        confidence = given.get("confidence", base.confidence)
        if confidence not in ("answer", "logprobs"):
            raise AllocationError(f"{where}: 'cascade.confidence' must be 'answer' (a confidence field of the JSON "
                                  f"reply) or 'logprobs', got {confidence!r}")

        def count(name: str, low: int, value: Any, *, none: bool = True) -> Any:
            if value is None and none:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AllocationError(f"{where}: 'cascade.{name}' must be a count of at least {low}"
                                      f"{' or null' if none else ''}, got {value!r}")
            return value

        silence = given.get("silence_s", base.silence_s)
        if silence is not None and (isinstance(silence, bool) or not isinstance(silence, int | float)
                                    or not silence > 0):
            raise AllocationError(f"{where}: 'cascade.silence_s' must be positive seconds or null, got {silence!r}")
        low = given.get("min_confidence", base.min_confidence)
        if isinstance(low, bool) or not isinstance(low, int | float) or not 0 <= low <= 1:
            raise AllocationError(f"{where}: 'cascade.min_confidence' must be in [0, 1], got {low!r}")
        if not isinstance(key, str) or not key:
            raise AllocationError(f"{where}: 'cascade.key' must be a non-empty name, got {key!r}")
        return cls(ordered, key, tuple(dict.fromkeys(monitors)), count("failures", 1, given.get("failures",
                   base.failures)), None if silence is None else float(silence),
                   count("repeats", 2, given.get("repeats", base.repeats)), float(low),
                   cast(ConfidenceSource, confidence), count("streak", 1, given.get("streak", base.streak),
                                                             none=False))

    def monitor_set(self) -> MonitorSet:
        monitors: list[Monitor] = []
        for name in self.monitors:
            if name == "stuck":
                monitors.append(StuckMonitor(failures=self.failures, silence_s=self.silence_s, repeats=self.repeats))
            elif name == "milestone":
                monitors.append(MilestoneMonitor())
            else:
                monitors.append(LowConfidenceMonitor(self.min_confidence))
        return MonitorSet(monitors)


def _tiers(table: TierTable, tiers: Any, where: str) -> tuple[str, ...]:
    """A step's ``tiers`` (default: the table's), checked, cheapest first."""
    if tiers is None:
        tiers = list(table.tiers)
    if not isinstance(tiers, list | tuple) or not tiers or not all(isinstance(t, str) for t in tiers):
        raise AllocationError(f"{where}: 'tiers' must be a non-empty list of tier names, got {tiers!r}")
    for t in tiers:
        if t not in table:
            raise AllocationError(f"{where}: 'tiers' names unknown tier '{t}' (known tiers: "
                                  f"{', '.join(sorted(table.tiers))})")
    return tuple(sorted(dict.fromkeys(tiers), key=lambda t: table[t].cost_usd))


DEFAULTS = CascadeArgs(tiers=(), key="", monitors=MONITORS, failures=2, silence_s=None, repeats=3,
                       min_confidence=0.5, confidence="answer", streak=3)


@dataclass(slots=True)
class _Watch:
    """One step of a run under a cascade: its monitors, and the attempt in flight (its tier, whether it fired)."""

    args: CascadeArgs
    cascade: Cascade
    monitors: MonitorSet
    ran_at: int = 0
    attempt: int = 0
    fired: set[int] = field(default_factory=set)  # attempts a monitor fired on already (their failure is acted on)


class CascadeSeam:
    """Tiers for ``model: cascade`` steps of the runs of the engine it is bound to; see the module docstring.

    ``runs`` reads a run by id (``Engine.get``; or :meth:`bind` the engine); a seam that is given ``runs`` rather
    than bound follows each run's events from its first cascaded attempt (an ``llm`` tool given only an
    :class:`~planweave.allocate.AllocationSeam` cascades through one of these on the allocator's table and runs).
    ``defaults`` are the settings a step's ``cascade:`` mapping may override (monitors, failures, silence_s,
    repeats, min_confidence, confidence, streak). With ``auto``, steps saying ``model: auto`` are cascaded too
    (``planweave run --tiers FILE --cascade``) rather than allocated. ``shifts`` keeps every move made.
    ``hurried`` says which runs are under deadline pressure (:meth:`AllocationSeam.hurried`): their attempts run
    on the fastest tier at or above the cascade's.
    """

    def __init__(self, table: TierTable, runs: Callable[[str], Any] | None = None, *,
                 defaults: CascadeArgs | None = None, tool: str = "llm", auto: bool = False,
                 hurried: Callable[[str], bool] | None = None) -> None:
        self.table = table
        self.auto = auto
        self._hurried = hurried  # runs under deadline pressure (AllocationSeam.hurried): the fastest tier allowed
        self.defaults = defaults or DEFAULTS
        self.tool = tool
        self._runs: Callable[[str], CascadedRun] | None = runs
        self._engine_wide = False  # bound to an engine's every event (else: following runs one by one)
        self._followed: set[str] = set()
        self._cascades: dict[tuple[str, str], Cascade] = {}
        self._watches: dict[tuple[str, str], _Watch] = {}
        self.shifts: list[tuple[str, str, Shift]] = []  # (run, step, shift)

    def bind(self, engine: CascadeHost) -> None:
        """Read ``engine``'s runs and follow their events (the tool is built before the engine it runs in)."""
        self._runs = engine.get
        self._engine_wide = True
        engine.subscribe(self.observe)

    def parse(self, args: Mapping[str, Any], *, step: str) -> CascadeArgs:
        return CascadeArgs.parse(self.table, args, self.defaults, step=step, tool=self.tool)

    # -- the tool's side ----------------------------------------------------------------------------------------
    def begin(self, ctx: StepContext, args: CascadeArgs) -> str:
        """The tier this attempt of ``ctx``'s step runs at (its cascade's, or the step's escalated floor)."""
        if not self._engine_wide and ctx.run_id not in self._followed:
            run = self._run(ctx.run_id)
            if run is not None:
                run.subscribe(self.observe)
                self._followed.add(ctx.run_id)
        key = (ctx.run_id, args.key)
        cascade = self._cascades.get(key)
        if cascade is None:
            cascade = self._cascades[key] = Cascade(args.tiers, streak=args.streak)
            self._restore(ctx.run_id, args.key, cascade)
        watch = self._watches.get((ctx.run_id, ctx.step_id))
        if watch is None or watch.cascade is not cascade:
            watch = self._watches[(ctx.run_id, ctx.step_id)] = _Watch(args, cascade, args.monitor_set())
        watch.ran_at = cascade.index_for(ctx.step_id)
        if self._hurried is not None and self._hurried(ctx.run_id):
            watch.ran_at = self._fastest(cascade, watch.ran_at)
        watch.attempt = ctx.attempt
        watch.monitors.observe(Signal("started", ctx.clock.now()))
        return cascade.tiers[watch.ran_at]

    def _fastest(self, cascade: Cascade, at: int) -> int:
        """Deadline pressure: the fastest tier (the table's ``duration_s``; the cheaper on a tie) at or above
        ``at``, the tier the monitors have brought the step to: never a tier below what they escalated to."""
        return min(range(at, len(cascade.tiers)), key=lambda i: (self.table[cascade.tiers[i]].duration_s, i))

    def signal(self, ctx: StepContext, signal: Signal) -> tuple[Fire | None, Shift | None]:
        """Feed the running attempt's monitors ``signal``; on a fire, escalate (journaled). The fire and the move
        (None at the strongest tier)."""
        watch = self._watches[(ctx.run_id, ctx.step_id)]
        fire = watch.monitors.observe(signal)
        if fire is None:
            return None, None
        return fire, self._fired(ctx.run_id, ctx.step_id, watch, fire, ctx.attempt)

    def due(self, ctx: StepContext) -> float | None:
        """When the running attempt's silence would fire (None: not watched)."""
        return self._watches[(ctx.run_id, ctx.step_id)].monitors.due()

    def check(self, ctx: StepContext) -> tuple[Fire | None, Shift | None]:
        """Fire the running attempt's silence if its time has come."""
        watch = self._watches[(ctx.run_id, ctx.step_id)]
        fire = watch.monitors.check(ctx.clock.now())
        if fire is None:
            return None, None
        return fire, self._fired(ctx.run_id, ctx.step_id, watch, fire, ctx.attempt)

    # -- the run's side -----------------------------------------------------------------------------------------
    def observe(self, event: Event) -> None:
        """An engine listener: attempts of watched steps failing or succeeding, progress, verifier verdicts."""
        kind, sid = event.kind, event.step
        if kind == "run_finished":
            self._forget(event.run_id)
            return
        if sid is None or kind not in ("step_failed", "step_succeeded", "step_progress"):
            return
        watch = self._watches.get((event.run_id, sid))
        if watch is not None:
            if kind == "step_progress":
                watch.monitors.observe(Signal("progress", event.at))
            elif kind == "step_failed":
                attempt = event.data.get("attempt", watch.attempt)
                if attempt in watch.fired:
                    return  # a monitor fired on this attempt already: escalated once for it
                fire = watch.monitors.observe(Signal("failed", event.at, detail=str(event.data.get("kind") or "")))
                if fire is not None:
                    self._fired(event.run_id, sid, watch, fire, attempt)
                else:
                    watch.cascade.failed(sid)
            else:
                watch.monitors.observe(Signal("succeeded", event.at))
                shift = watch.cascade.succeeded(sid)
                if shift is not None:
                    self._journal(event.run_id, sid, shift, watch)
        if kind == "step_succeeded":
            self._verdict(event, sid)

    def _verdict(self, event: Event, sid: str) -> None:
        """A ``verifies:`` step rejected a watched step: its milestone monitor fires (the step's next run, after a
        re-plan, starts higher)."""
        run = self._run(event.run_id)
        step = run.plan.steps.get(sid) if run is not None else None
        if run is None or step is None or step.verifies is None:
            return
        target = self._watches.get((event.run_id, step.verifies))
        out = run.outputs.get(sid)
        if target is None or not isinstance(out, Mapping) or out.get("ok") is not False:
            return
        fire = target.monitors.observe(Signal("rejected", event.at, key=f"verifier step '{sid}'",
                                              detail=str(out.get("reason", "no reason given"))))
        if fire is not None:
            self._fired(event.run_id, step.verifies, target, fire, target.attempt)

    def _fired(self, run_id: str, sid: str, watch: _Watch, fire: Fire, attempt: int) -> Shift | None:
        watch.fired.add(attempt)
        shift = watch.cascade.fired(sid, fire, ran_at=watch.ran_at)
        if shift is not None:
            self._journal(run_id, sid, shift, watch, attempt=attempt)
        return shift

    def _journal(self, run_id: str, sid: str, shift: Shift, watch: _Watch, *, attempt: int | None = None) -> None:
        self.shifts.append((run_id, sid, shift))
        run = self._run(run_id)
        if run is None:
            return
        data: dict[str, Any] = {"rung": shift.rung, "reason": shift.reason, "from_tier": shift.from_tier,
                                "to_tier": shift.to_tier, "model": self.table[shift.to_tier].model,
                                "cascade": watch.args.key}
        if shift.monitor is not None:
            data["monitor"] = shift.monitor
        else:
            data["streak"] = watch.cascade.streak
        if attempt is not None:
            data["attempt"] = attempt
        run.record("escalation", data, sid)

    def _run(self, run_id: str) -> CascadedRun | None:
        if self._runs is None:
            return None
        try:
            return self._runs(run_id)
        except (RunError, AllocationError):  # not active in the engine (finished), or nothing bound
            return None

    def _restore(self, run_id: str, key: str, cascade: Cascade) -> None:
        """Seed a run's new cascade from the moves it journaled (a resumed run goes on at its escalated tier; a new
        run has none)."""
        state = getattr(self._run(run_id), "state", None)
        if state is None:
            return
        moves = [e for e in state.escalations if e.get("cascade") == key]
        if moves:
            cascade.restore(moves, [sid for sid, rec in state.records.items() if rec.status == "succeeded"])

    def _forget(self, run_id: str) -> None:
        self._followed.discard(run_id)
        for key in [k for k in self._watches if k[0] == run_id]:
            del self._watches[key]
        for key in [k for k in self._cascades if k[0] == run_id]:
            del self._cascades[key]


# -- the tool's call ------------------------------------------------------------------------------------------------
CascadeCall = Callable[[str, Callable[[], None] | None, int | None], Awaitable[dict[str, Any]]]
"""One call of the step on a model: ``(model, on_progress, top_logprobs)`` -> the tool's result (``on_progress``
told once the budget had room and at each streamed chunk; with ``logprobs``,
each token's top logprobs, when asked for)."""


async def cascaded_call(single: CascadeCall, *, seam: CascadeSeam | None, args: Mapping[str, Any],
                        verifiers: Mapping[str, Verifier]) -> dict[str, Any]:
    """Run one attempt of a ``model: cascade`` step at the tier its cascade gives, feeding the monitors what the
    attempt shows; a fire that escalates fails the attempt (retryable) so its retry runs on the stronger tier."""
    if seam is None:
        raise ToolError("model: cascade needs a tier table: this llm tool was built without a cascade "
                        "(planweave run --tiers FILE, or llm_tool(..., cascade=CascadeSeam(tiers)))",
                        kind="arguments", retryable=False)
    try:
        ctx = current_step()
    except LookupError:
        raise ToolError("model: cascade is decided for a step of a run; called outside one", kind="arguments",
                        retryable=False) from None
    if args.get("samples") is not None or args.get("select") is not None:
        raise ToolError(f"step '{ctx.step_id}': model: cascade runs one call per attempt: samples and select "
                        "need model: auto or a fixed model", kind="arguments", retryable=False)
    name = args.get("verifier")
    verify = None if name is None else _verifier(verifiers, name)
    try:
        cargs = seam.parse(args, step=ctx.step_id)
    except AllocationError as exc:
        raise ToolError(str(exc), kind="arguments", retryable=False) from None
    tier = seam.begin(ctx, cargs)
    model = seam.table[tier].model
    want_logprobs = "low_confidence" in cargs.monitors and cargs.confidence == "logprobs"

    def tick() -> None:
        seam.signal(ctx, Signal("progress", ctx.clock.now()))

    def escalated(fire: Fire, shift: Shift | None, kind: str) -> ToolError:
        where = f"on tier '{tier}'" + (f", escalated to '{shift.to_tier}'" if shift is not None else "")
        return ToolError(f"{fire.monitor}: {fire.reason} ({where})", kind=kind, retryable=True)

    try:
        result = await _watched(seam, ctx, single(model, tick if cargs.silence_s is not None else None,
                                                  TOP_LOGPROBS if want_logprobs else None))
    except ToolError as exc:
        if exc.kind == "malformed_output" and "milestone" in cargs.monitors:
            seam.signal(ctx, Signal("rejected", ctx.clock.now(), key="schema", detail=str(exc)))
        raise
    tokens = result.pop("logprobs", None)
    result["cascade"] = {"tier": tier, "key": cargs.key}
    now = ctx.clock.now()
    fire, shift = seam.signal(ctx, Signal("action", now, key=output_key(result)))
    if fire is not None:
        raise escalated(fire, shift, "stuck")
    if verify is not None and not await verify(result):
        fire, shift = seam.signal(ctx, Signal("rejected", now, key=f"verifier '{name}'", detail="rejected"))
        if fire is not None:
            raise escalated(fire, shift, "rejected_by_verifier")
        raise ToolError(f"verifier '{name}' rejected the result (tier '{tier}')", kind="rejected_by_verifier")
    confidence = logprob_margin(tokens) if want_logprobs and tokens else reported_confidence(result.get("json"))
    if confidence is not None:
        result["cascade"]["confidence"] = round(confidence, 4)
        fire, shift = seam.signal(ctx, Signal("confidence", now, key="logprobs" if want_logprobs else "answer",
                                              value=confidence))
        if fire is not None and shift is not None:  # at the strongest tier nothing better to ask: it stands
            raise escalated(fire, shift, "low_confidence")
    return result


def _verifier(verifiers: Mapping[str, Verifier], name: str) -> Verifier:
    if name not in verifiers:
        known = ", ".join(sorted(verifiers)) or "none"
        raise ToolError(f"verifier '{name}' is not one the llm tool was given (known: {known})",
                        kind="arguments", retryable=False)
    return verifiers[name]


async def _watched(seam: CascadeSeam, ctx: StepContext, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Await ``call``, unless the attempt's silence fires first: then cancel it and fail the attempt (kind
    ``stuck``, retryable; the step escalated). One timer, moved by progress, not a polling loop."""
    if seam.due(ctx) is None:
        return await call
    task = asyncio.ensure_future(call)
    try:
        while True:
            due = seam.due(ctx)
            wait = None if due is None else max(0.0, due - ctx.clock.now())
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            fire, shift = seam.check(ctx)
            if fire is not None:
                where = f", escalated to '{shift.to_tier}'" if shift is not None else ""
                raise ToolError(f"stuck: {fire.reason}{where}", kind="stuck", retryable=True)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# -- the planner's tier ---------------------------------------------------------------------------------------------
PLANNER = "(planner)"
"""The subject name of a run's planner in its cascade (not a step id: step ids are identifiers)."""


class PlannedRun(Protocol):
    """What the planner's cascade needs of a run: its id and a way to journal."""

    @property
    def id(self) -> str: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...


class PlannerRun(PlannedRun, Protocol):
    """What the planner's allocation reads of a run too (``allocate/planner_alloc.py``): its plan and state."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> RunState: ...


class PlannerCascade:
    """The model tier of a goal run's planner (planning/loop.py): the cheapest of ``tiers`` first; escalated for
    the next model call when its monitors fire (stuck: ``failures`` rejected plans or repairs in a row; milestone:
    a verifier step rejected the plan's work), de-escalated after ``streak`` accepted plans in a row. Journaled as
    ``escalation`` events without a step, ``cascade`` "planner"."""

    mode = "cascade"  # journaled (options.limits.planner) when not a cascade: a resume builds the same kind again

    def __init__(self, table: TierTable, tiers: list[str] | tuple[str, ...] | None = None, *, streak: int = 3,
                 failures: int = 2) -> None:
        self.table = table
        self.tiers = _tiers(table, None if tiers is None else list(tiers), "the planner")
        self.streak, self.failures = streak, failures
        self._runs: dict[str, tuple[Cascade, MonitorSet]] = {}
        self.shifts: list[tuple[str, Shift]] = []

    def _of(self, run_id: str) -> tuple[Cascade, MonitorSet]:
        found = self._runs.get(run_id)
        if found is None:
            found = self._runs[run_id] = (Cascade(self.tiers, streak=self.streak), MonitorSet([
                StuckMonitor(failures=self.failures, repeats=None), MilestoneMonitor()]))
        return found

    async def choose(self, run: PlannerRun, purpose: str) -> None:
        """Before each planner call (``purpose``: plan, replan, repair, join): a cascade's tier moves on the
        monitors' fires alone; :class:`~planweave.allocate.planner_alloc.PlannerAllocation` decides here."""
        return None

    def model(self, run_id: str) -> str:
        """The model the planner of run ``run_id`` calls next."""
        cascade, _ = self._of(run_id)
        return self.table[cascade.tier_for(PLANNER)].model

    def observe(self, run: PlannedRun, signal: Signal) -> Shift | None:
        """Feed the planner's monitors: ``failed`` (its reply was rejected), ``succeeded`` (its plan was taken),
        ``rejected`` (a verifier refused the plan's work); journal a move."""
        cascade, monitors = self._of(run.id)
        shift: Shift | None = None
        if signal.kind == "succeeded":
            monitors.observe(signal)
            shift = cascade.succeeded(PLANNER)
        elif (fire := monitors.observe(signal)) is not None:
            shift = cascade.fired(PLANNER, fire)
        else:
            cascade.failed(PLANNER)
        if shift is not None:
            self.shifts.append((run.id, shift))
            data: dict[str, Any] = {"rung": shift.rung, "reason": shift.reason, "from_tier": shift.from_tier,
                                    "to_tier": shift.to_tier, "model": self.table[shift.to_tier].model,
                                    "cascade": "planner"}
            if shift.monitor is not None:
                data["monitor"] = shift.monitor
            else:
                data["streak"] = cascade.streak
            run.record("escalation", data)
        return shift

    def restore(self, run_id: str, escalations: list[dict[str, Any]]) -> None:
        """Go on where run ``run_id``'s planner was (its journaled ``escalation`` events' data, cascade "planner",
        as ``RunState.escalations`` keeps them): a resumed goal run's planner and joiner call the tier it had
        escalated to, not the cheapest."""
        cascade, _ = self._of(run_id)
        cascade.restore([{**e, "step": PLANNER} for e in escalations if e.get("cascade") == "planner"])

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
