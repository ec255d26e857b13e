"""A run's emission: the only place its state changes. Each event is journaled (when the journal keeps it), folded
into the run's :class:`~planweave.core.state.RunState`, shown to the listeners, and the steps it made ready are
handed on (to the run's attempts: approval, speculative attempt or the dispatcher's queue)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from planweave.core.errors import EventNotRecorded
from planweave.core.events import Event, EventKind
from planweave.core.state import RunState
from planweave.engine.host import EventListener, RunHost
from planweave.engine.protocols import PlanSeal
from planweave.journal.base import NullJournal, scrub

_PLAN_KINDS = frozenset({"run_created", "plan_version", "steps_added"})
# Events whose data must be journaled exactly as given (plans, a person's input): refused, never scrubbed.
_EXACT_KINDS = frozenset({"run_created", "steps_added", "plan_version", "input_given"})
_new_event = tuple.__new__  # an Event of every field, without the Python-level call of its __new__
#: What :meth:`Emission.record` takes: events about the run that are not step transitions.
RECORDED: tuple[EventKind, ...] = ("model_call", "model_released", "escalation", "answer", "warning", "allocation",
                                   "forecast")


def _sealing(append: Callable[[Event], None], seal: PlanSeal) -> Callable[[Event], None]:
    """``append``, sealing the plans of the events that carry one first (the run itself keeps the values)."""

    def append_sealed(event: Event) -> None:
        append(seal.seal(event) if event[1] in _PLAN_KINDS else event)

    return append_sealed


def _no_ready(ready: Sequence[str], now: float) -> None:  # pragma: no cover - replaced when the run is wired
    raise RuntimeError("the run's emission is not wired to its attempts")


class Emission:
    """Journal, fold and show one run's events; hand the steps an event made ready to :attr:`on_ready`."""

    def __init__(self, run_id: str, state: RunState, host: RunHost) -> None:
        self.run_id = run_id
        self.state = state
        self.now = host.clock.now
        self.listeners: list[EventListener] = list(host.listeners)
        journal = host.journal
        self.append: Callable[[Event], None] | None = (
            journal.append if host.seal is None else _sealing(journal.append, host.seal))
        if host.seal is None and isinstance(journal, NullJournal):
            self.append = None  # a journal that keeps nothing: no call per event
        self.on_ready: Callable[[Sequence[str], float], None] = _no_ready  # the run's attempts, once wired

    def emit(self, kind: EventKind, step: str | None, data: Mapping[str, Any]) -> None:
        """Journal, fold and show one event (raises EventNotRecorded, changing nothing, if the journal refuses a
        plan or a person's input; other data is recorded with lone surrogates replaced rather than lost)."""
        # Hot path (several calls per step): the tuple is built directly rather than through Event's __new__.
        event: Event = _new_event(Event, (self.run_id, kind, self.now(), step, data, None))
        append = self.append
        if append is not None:
            try:
                append(event)  # before the fold: an event the journal refuses changes nothing
            except EventNotRecorded:
                if kind in _EXACT_KINDS:
                    raise
                # Text the engine passes on (tool errors, progress, model replies) may hold lone surrogates: record
                # it with U+FFFD in their place rather than lose the event.
                event = _new_event(Event, (self.run_id, kind, event[2], step, scrub(data), None))
                append(event)
        ready = self.state.apply(event)
        if self.listeners:
            for listener in self.listeners:
                listener(event)
        if ready:
            self.on_ready(ready, event[2])

    def emit_step(self, kind: Literal["step_started", "step_succeeded"], sid: str, data: Mapping[str, Any]) -> None:
        """An attempt's start or success, through :meth:`emit`; but when nothing can see the event (a journal that
        keeps nothing, no listener), folded without building it: the same fold, a tuple and two calls less (~6 % of
        a no-op step's instructions on null://: docs/benchmarks.md, "the event nobody sees")."""
        if self.append is not None or self.listeners:
            self.emit(kind, sid, data)
            return
        state = self.state
        state.events_applied += 1
        now = self.now()
        if kind == "step_started":
            state.step_started(sid, now, data)  # type: ignore[arg-type]
        elif ready := state.step_succeeded(sid, now, data):  # type: ignore[arg-type]
            self.on_ready(ready, now)

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None:
        """Journal an event about the run that is not a step transition (one of :data:`RECORDED`)."""
        if kind not in RECORDED:
            raise ValueError(f"record() takes {', '.join(RECORDED)} events, not {kind}")
        self.emit(kind, step, data)
