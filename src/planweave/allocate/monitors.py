"""Escalation monitors: small pure objects fed what a step (or the planner) does, each saying when to escalate.

A monitor watches one subject (a step of a run across its attempts, or a run's planner). It is fed
:class:`Signal` values (an attempt started, progress arrived, an attempt failed or succeeded, an action was taken,
a check rejected an output, a model reported its confidence) with the clock time, and answers a :class:`Fire`
(which monitor, why) or None. Time-based watching is pull: :meth:`StuckMonitor.due` says when silence would fire and
:meth:`StuckMonitor.check` fires once that time has come, so the adapter sets one timer rather than polling.

- :class:`StuckMonitor`: ``failures`` failures in a row; a started attempt with no progress for ``silence_s``
  seconds; the same action ``repeats`` times in a row.
- :class:`MilestoneMonitor`: a check of the subject's output failed (its ``schema:``, a verifier).
- :class:`LowConfidenceMonitor`: the model's own confidence (reported, or its top-logprob margin) is below a
  threshold.

The adapters (``allocate/cascade_seam.py``, the planning loop) translate the run's events and the tool's
observations into signals and act on a fire through a :class:`~planweave.allocate.cascade.Cascade`. No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

MonitorName = Literal["stuck", "milestone", "low_confidence"]
MONITORS: tuple[str, ...] = get_args(MonitorName)

SignalKind = Literal["started", "progress", "failed", "succeeded", "action", "rejected", "confidence"]


@dataclass(frozen=True, slots=True)
class Signal:
    """One thing a monitored subject did, at clock time ``at``.

    ``started``/``progress``: an attempt began, or showed life (a streamed token, a heartbeat, a progress event);
    ``failed`` (``detail``: the error) / ``succeeded``: an attempt ended; ``action``: the subject did ``key`` (a
    rendered action: the same key twice is the same action); ``rejected``: a check (``key``: which) refused the
    output, ``detail`` why; ``confidence``: the model's confidence in its answer was ``value`` (0..1).
    """

    kind: SignalKind
    at: float
    key: str = ""
    detail: str = ""
    value: float | None = None


@dataclass(frozen=True, slots=True)
class Fire:
    """A monitor fired: ``monitor`` names it, ``reason`` says what it saw."""

    monitor: MonitorName
    reason: str


class StuckMonitor:
    """Fires on ``failures`` failed attempts in a row, on ``silence_s`` seconds without progress in a started
    attempt, or on the same action ``repeats`` times in a row (each None: not watched).

    After it fires, its counts start again: the escalated subject gets the same allowance at its new tier.
    """

    name: MonitorName = "stuck"

    def __init__(self, *, failures: int | None = 2, silence_s: float | None = None, repeats: int | None = 3) -> None:
        if failures is not None and failures < 1:
            raise ValueError(f"stuck monitor: failures must be at least 1, got {failures}")
        if silence_s is not None and not silence_s > 0:
            raise ValueError(f"stuck monitor: silence_s must be positive, got {silence_s}")
        if repeats is not None and repeats < 2:
            raise ValueError(f"stuck monitor: repeats must be at least 2, got {repeats}")
        self.failures, self.silence_s, self.repeats = failures, silence_s, repeats
        self._failed = 0
        self._last_action: str | None = None
        self._same = 0
        self._alive_at: float | None = None  # the last sign of life of a started attempt (None: none running)

    def observe(self, signal: Signal) -> Fire | None:
        kind = signal.kind
        if kind in ("started", "progress"):
            if kind == "started" or self._alive_at is not None:
                self._alive_at = signal.at
            return None
        if kind == "succeeded":
            self._failed, self._same, self._last_action, self._alive_at = 0, 0, None, None
            return None
        if kind == "failed":
            self._alive_at = None
            self._failed += 1
            if self.failures is not None and self._failed >= self.failures:
                count = self._failed
                self.reset()
                return Fire("stuck", f"{count} failures in a row (last: {signal.detail or 'no error given'})")
            return None
        if kind == "action":
            self._same = self._same + 1 if signal.key == self._last_action else 1
            self._last_action = signal.key
            if self.repeats is not None and self._same >= self.repeats:
                count = self._same
                self.reset()
                return Fire("stuck", f"the same action {count} times in a row: {signal.key[:200]}")
        return None

    def due(self) -> float | None:
        """The clock time silence fires at, if nothing shows life before (None: no started attempt, or not
        watched)."""
        if self.silence_s is None or self._alive_at is None:
            return None
        return self._alive_at + self.silence_s

    def check(self, now: float) -> Fire | None:
        """Fire if a started attempt has shown no life for ``silence_s`` seconds at ``now``."""
        due = self.due()
        if due is None or now < due:
            return None
        assert self.silence_s is not None
        self.reset()
        return Fire("stuck", f"no progress for {self.silence_s:g} s")

    def reset(self) -> None:
        """Forget the counts and the running attempt (after a fire, or when the subject changed tier)."""
        self._failed, self._same, self._last_action, self._alive_at = 0, 0, None, None


class MilestoneMonitor:
    """Fires when a check of the output fails: the step's ``schema:``, a named verifier, a ``verifies:`` step."""

    name: MonitorName = "milestone"

    def observe(self, signal: Signal) -> Fire | None:
        if signal.kind != "rejected":
            return None
        what = signal.key or "a check"
        return Fire("milestone", f"{what} failed: {signal.detail or 'no reason given'}"[:2000])


class LowConfidenceMonitor:
    """Fires when a reported confidence is below ``threshold`` (a confidence of None, where the endpoint gives
    none, never fires)."""

    name: MonitorName = "low_confidence"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0 <= threshold <= 1:
            raise ValueError(f"low-confidence monitor: threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def observe(self, signal: Signal) -> Fire | None:
        if signal.kind != "confidence" or signal.value is None or signal.value >= self.threshold:
            return None
        return Fire("low_confidence", f"confidence {signal.value:.3f} below {self.threshold:g}"
                    + (f" ({signal.key})" if signal.key else ""))


Monitor = StuckMonitor | MilestoneMonitor | LowConfidenceMonitor


class MonitorSet:
    """The monitors of one subject, fed together: the first that fires answers (then all are reset)."""

    def __init__(self, monitors: Sequence[Monitor]) -> None:
        self.monitors = tuple(monitors)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.monitors)

    def observe(self, signal: Signal) -> Fire | None:
        fired: Fire | None = None
        for monitor in self.monitors:
            fire = monitor.observe(signal)
            if fire is not None and fired is None:
                fired = fire
        if fired is not None:
            self.reset()
        return fired

    def due(self) -> float | None:
        times = [t for m in self.monitors if isinstance(m, StuckMonitor) and (t := m.due()) is not None]
        return min(times) if times else None

    def check(self, now: float) -> Fire | None:
        for monitor in self.monitors:
            if isinstance(monitor, StuckMonitor) and (fire := monitor.check(now)) is not None:
                self.reset()
                return fire
        return None

    def reset(self) -> None:
        for monitor in self.monitors:
            if isinstance(monitor, StuckMonitor):
                monitor.reset()


def logprob_margin(tokens: Sequence[Sequence[float]]) -> float | None:
    """A reply's confidence from its per-token top logprobs (each token's alternatives, best first): the mean over
    tokens of p(best) - p(second best), in [0, 1] (a token with one alternative counts p(best)); None without
    tokens."""
    margins = []
    for top in tokens:
        if not top:
            continue
        ranked = sorted(top, reverse=True)
        first = math.exp(ranked[0])
        second = math.exp(ranked[1]) if len(ranked) > 1 else 0.0
        margins.append(max(0.0, min(1.0, first - second)))
    return sum(margins) / len(margins) if margins else None


def reported_confidence(output: Any, field: str = "confidence") -> float | None:
    """The confidence a model reported in its JSON answer (``output[field]``, a number in [0, 1]; a percentage
    above 1 up to 100 is read as one); None when it reported none."""
    if not isinstance(output, Mapping):
        return None
    value = output.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    if value > 1:
        return float(value) / 100 if value <= 100 else None
    return float(value)
