"""Admission control for model calls: one scheduler per endpoint and model, shared by every run of a process.

Thousands of runs sharing a few endpoints thrash when each sends what it likes: calls pile up past the server's
knee, latency climbs, 429s arrive and retries add to the pile. Every call of an :class:`~planweave.models.openai.
OpenAIChatClient` (planner, joiner, ``llm`` steps of all runs) therefore asks its endpoint's scheduler for a slot
first. Two parts:

* :class:`EndpointPolicy` decides, and is pure: no asyncio, no I/O; every method takes ``now``, so it runs on any
  clock and is property-tested directly. It keeps the queue in priority order and admits the head while the limits
  allow: ``max_concurrency`` calls in flight, ``requests_per_minute`` and ``tokens_per_minute`` over a sliding
  window, a pause a 429's ``Retry-After`` asked for, and (``adaptive``) a congestion window that grows by one call
  per window of good calls and halves on a 429, a 5xx or a time to first token past a threshold (AIMD, as TCP
  does).
* :class:`EndpointScheduler` drives one policy on the running event loop: a call awaits a future the policy's
  admissions resolve; a timer (never a polling loop) wakes the queue when a rate limit or a pause lifts.

Priority: the queue key is ``aging * enqueued_at + slack - priority_weight * priority``, smallest first. ``slack``
is how many seconds the calling step may be late without delaying its run (0 on the critical path and for the
planner), ``priority`` the run's priority; every second a call waits counts like ``aging`` seconds of slack, so a
call waits at most as long as the spread of the other terms divided by ``aging``: nothing starves. The predicted
output length (shortest first) breaks ties. ``order="fcfs"`` keeps arrival order instead.

A call learns its class from :func:`call_class`: what :func:`call_context` set (the planning loop does), else the
running step (:func:`planweave.core.context.current_step`: its run's priority and its slack), else the default.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from planweave.core.context import current_step

Order = Literal["priority", "fcfs"]
TicketState = Literal["queued", "admitted", "done", "withdrawn"]
Signal = Literal["ok", "rate_limited", "server_error", "slow_first_token", "failed"]

WAIT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the queue-wait histogram every endpoint keeps (``/metrics``)."""

UNBOUNDED_WINDOW = 1024.0  # an adaptive window with no max_concurrency grows to this


class CallTooLarge(ValueError):
    """A call needs more tokens than its endpoint's ``tokens_per_minute`` allows in a whole window: it never fits."""


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """The limits and policy of one endpoint/model.

    ``max_concurrency`` calls in flight (None: no limit); ``requests_per_minute`` and ``tokens_per_minute`` over a
    sliding ``window`` of seconds (60; a shorter window allows the same rate in proportion: ``rpm * window / 60``
    in any such span). ``adaptive`` turns on the AIMD window: it starts at ``initial_window`` (default 4, at most
    ``max_concurrency``), doubles every round of good calls until the first congestion signal (slow start), then
    grows by ``increase`` per window of good calls, and halves (not below ``min_window``) on a
    429, a 5xx or a time to first token above ``ttft_threshold`` seconds (None: ``ttft_factor`` times the lowest
    seen), smoothed (each call weighs ``ttft_smoothing``). ``order``, ``aging`` and ``priority_weight`` shape the
    queue (see the module).
    """

    max_concurrency: int | None = 16
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    adaptive: bool = False
    initial_window: float | None = None
    min_window: float = 1.0
    increase: float = 1.0
    ttft_threshold: float | None = None
    ttft_factor: float = 2.0
    ttft_smoothing: float = 0.25
    order: Order = "priority"
    aging: float = 1.0
    priority_weight: float = 10.0
    window: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "tokens_per_minute", "requests_per_minute"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        positive = {"min_window": self.min_window, "increase": self.increase, "ttft_factor": self.ttft_factor,
                    "window": self.window, "aging": self.aging}
        for name, number in positive.items():
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"{name} must be a positive number, got {number!r}")
        if self.initial_window is not None and not (math.isfinite(self.initial_window) and self.initial_window >= 1):
            raise ValueError(f"initial_window must be at least 1, got {self.initial_window!r}")
        if not 0 < self.ttft_smoothing <= 1:
            raise ValueError(f"ttft_smoothing must be in (0, 1], got {self.ttft_smoothing!r}")
        if self.ttft_threshold is not None and not (math.isfinite(self.ttft_threshold) and self.ttft_threshold > 0):
            raise ValueError(f"ttft_threshold must be a positive number of seconds, got {self.ttft_threshold!r}")
        if not math.isfinite(self.priority_weight) or self.priority_weight < 0:
            raise ValueError(f"priority_weight must be a number >= 0, got {self.priority_weight!r}")
        if self.order not in ("priority", "fcfs"):
            raise ValueError(f"order must be 'priority' or 'fcfs', got {self.order!r}")

    @property
    def ceiling(self) -> float:
        """The largest the window may be."""
        return float(self.max_concurrency) if self.max_concurrency is not None else UNBOUNDED_WINDOW

    @property
    def request_allowance(self) -> int | None:
        """Requests allowed in any span of ``window`` seconds."""
        rpm = self.requests_per_minute
        return None if rpm is None else max(1, math.floor(rpm * self.window / 60.0))

    @property
    def token_allowance(self) -> int | None:
        """Tokens allowed in any span of ``window`` seconds."""
        tpm = self.tokens_per_minute
        return None if tpm is None else max(1, math.floor(tpm * self.window / 60.0))


@dataclass(frozen=True, slots=True)
class CallClass:
    """Who is calling, for the queue order: the run's ``priority`` (higher first), the step's ``slack`` in seconds
    (None: unknown, treated as critical), the predicted output tokens if known, and where it comes from."""

    priority: float = 0.0
    slack: float | None = None
    predicted_tokens: int | None = None
    run_id: str | None = None
    step_id: str | None = None
    purpose: str = "call"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an admitted call ended: HTTP ``status`` (None: no answer, e.g. a connection error or a cancellation),
    seconds to the first token if known, and the tokens it really used (corrects the estimate it was admitted with)."""

    status: int | None
    first_token_s: float | None = None
    tokens: int | None = None


@dataclass(slots=True, eq=False)
class Ticket:
    """One call's place in an endpoint's queue, then its slot."""

    call: CallClass
    tokens: int
    enqueued_at: float
    key: tuple[float, float, int]
    state: TicketState = "queued"
    admitted_at: float | None = None
    signal: Signal | None = None  # what its outcome said, once finished

    @property
    def waited(self) -> float | None:
        """Seconds from queueing to admission (None while queued)."""
        return None if self.admitted_at is None else self.admitted_at - self.enqueued_at


@dataclass(frozen=True, slots=True)
class EndpointStats:
    """What an endpoint's scheduler has decided: the live figures and the counters since it started."""

    endpoint: str
    queued: int
    in_flight: int
    window: float
    limit: int | None
    admitted: int
    finished: int
    wait_sum: float
    wait_max: float
    oldest_wait: float
    wait_buckets: tuple[int, ...]
    signals: Mapping[str, int]
    decreases: int
    paused_for: float
    requests_in_window: int
    tokens_in_window: int


class EndpointPolicy:
    """The pure admission decisions of one endpoint (see the module): queue, limits, AIMD window, statistics."""

    def __init__(self, limits: EndpointLimits, name: str = "endpoint") -> None:
        self.limits = limits
        self.name = name
        start = limits.initial_window if limits.initial_window is not None else 4.0
        self.window = min(max(start, limits.min_window), limits.ceiling) if limits.adaptive else limits.ceiling
        self.in_flight = 0
        self.paused_until = -math.inf
        self.threshold = limits.ceiling  # the slow-start threshold: the window halved at the last signal
        self.lowest_ttft: float | None = None
        self.smoothed_ttft: float | None = None
        self.last_decrease = -math.inf
        self.decreases = 0
        self.admitted = 0
        self.finished = 0
        self.wait_sum = 0.0
        self.wait_max = 0.0
        self.wait_buckets = [0] * (len(WAIT_BUCKETS) + 1)
        self.signals: dict[str, int] = {}
        self._heap: list[tuple[tuple[float, float, int], Ticket]] = []
        self._queued = 0
        self._seq = itertools.count()
        self._requests: deque[float] = deque()  # admission times within the window
        self._tokens: deque[tuple[float, Ticket]] = deque()  # admissions carrying tokens, for the TPM window
        self._token_sum = 0

    # -- the queue ---------------------------------------------------------------------------------------------------
    def enqueue(self, call: CallClass, tokens: int, now: float, since: float | None = None) -> Ticket:
        """Queue a call that will use about ``tokens`` tokens (prompt and output); CallTooLarge if it never fits.

        ``since`` (a retry's first attempt) is when the call first asked: its age counts from then.
        """
        allowance = self.limits.token_allowance
        if allowance is not None and tokens > allowance:
            raise CallTooLarge(
                f"{self.name}: a call of about {tokens} tokens can never fit in tokens_per_minute "
                f"{self.limits.tokens_per_minute} (at most {allowance} per {self.limits.window:g}s): "
                "lower its max_tokens or raise the limit")
        seq = next(self._seq)
        born = now if since is None else min(since, now)
        if self.limits.order == "fcfs":
            key = (born, 0.0, seq)
        else:
            slack = call.slack if call.slack is not None else 0.0
            predicted = float(call.predicted_tokens) if call.predicted_tokens is not None else math.inf
            key = (self.limits.aging * born + slack - self.limits.priority_weight * call.priority, predicted, seq)
        ticket = Ticket(call, max(0, tokens), now, key)
        heapq.heappush(self._heap, (key, ticket))
        self._queued += 1
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """Take a queued call out of the queue (its caller gave up); it is dropped lazily from the heap."""
        if ticket.state == "queued":
            ticket.state = "withdrawn"
            self._queued -= 1

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def limit(self) -> int | None:
        """How many calls may be in flight now: the window (whole calls), within ``max_concurrency``."""
        if not self.limits.adaptive and self.limits.max_concurrency is None:
            return None
        return max(1, math.floor(self.window))

    def _forget(self, now: float) -> None:
        """Drop admissions that left the sliding window."""
        window = self.limits.window  # ``at + window <= now``, the very sum wake_at returns: no rounding gap
        requests = self._requests
        while requests and requests[0] + window <= now:
            requests.popleft()
        tokens = self._tokens
        while tokens and tokens[0][0] + window <= now:
            self._token_sum -= tokens.popleft()[1].tokens

    def _head(self) -> Ticket | None:
        heap = self._heap
        while heap and heap[0][1].state != "queued":
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def _rate_allows(self, ticket: Ticket) -> bool:
        rpm = self.limits.request_allowance
        if rpm is not None and len(self._requests) >= rpm:
            return False
        tpm = self.limits.token_allowance
        return tpm is None or self._token_sum + ticket.tokens <= tpm

    def admit(self, now: float) -> list[Ticket]:
        """Admit queued calls, best first, while the window, the rate limits and any pause allow.

        Strictly in order: when the head does not fit (too many tokens for what is left of the minute), nothing
        behind it passes, so a large call is never starved by a stream of small ones.
        """
        admitted: list[Ticket] = []
        if now < self.paused_until:
            return admitted
        self._forget(now)
        limit = self.limit
        while limit is None or self.in_flight < limit:
            ticket = self._head()
            if ticket is None or not self._rate_allows(ticket):
                break
            heapq.heappop(self._heap)
            self._queued -= 1
            ticket.state = "admitted"
            ticket.admitted_at = now
            self.in_flight += 1
            self.admitted += 1
            self._requests.append(now)
            self._tokens.append((now, ticket))
            self._token_sum += ticket.tokens
            self._count_wait(now - ticket.enqueued_at)
            admitted.append(ticket)
        return admitted

    def _count_wait(self, waited: float) -> None:
        self.wait_sum += waited
        self.wait_max = max(self.wait_max, waited)
        for i, bound in enumerate(WAIT_BUCKETS):
            if waited <= bound:
                self.wait_buckets[i] += 1
                return
        self.wait_buckets[-1] += 1

    def wake_at(self, now: float) -> float | None:
        """When a queue blocked by a pause or a rate limit (not by the window) could move next; None if it need not
        be woken by time (empty, admissible now, or waiting for a call in flight to finish)."""
        ticket = self._head()
        limit = self.limit
        if ticket is None or (limit is not None and self.in_flight >= limit):
            return None
        if now < self.paused_until:
            return self.paused_until
        self._forget(now)
        when: float | None = None
        rpm = self.limits.request_allowance
        if rpm is not None and len(self._requests) >= rpm:
            when = self._requests[len(self._requests) - rpm] + self.limits.window
        tpm = self.limits.token_allowance
        if tpm is not None and self._token_sum + ticket.tokens > tpm:
            freed, need = 0, self._token_sum + ticket.tokens - tpm
            for at, held in self._tokens:
                freed += held.tokens
                if freed >= need:
                    when = max(when or -math.inf, at + self.limits.window)
                    break
        return when

    # -- outcomes ----------------------------------------------------------------------------------------------------
    def pause(self, now: float, seconds: float) -> None:
        """Admit nothing for ``seconds`` (a 429 asked for it with Retry-After)."""
        self.paused_until = max(self.paused_until, now + max(0.0, seconds))

    def classify(self, outcome: Outcome) -> Signal:
        """What an outcome says about the endpoint's load."""
        status = outcome.status
        if status == 429:
            return "rate_limited"
        if status is not None and status >= 500:
            return "server_error"
        if status is None or status >= 400:
            return "failed"
        ttft = outcome.first_token_s
        if ttft is not None:
            threshold = self.limits.ttft_threshold
            if threshold is None and self.lowest_ttft is not None:
                threshold = self.limits.ttft_factor * max(self.lowest_ttft, 0.001)
            smoothed = self.smoothed_ttft
            if smoothed is not None:
                smoothed += self.limits.ttft_smoothing * (ttft - smoothed)
            if threshold is not None and (smoothed if smoothed is not None else ttft) > threshold:
                return "slow_first_token"
        return "ok"

    def finish(self, ticket: Ticket, now: float, outcome: Outcome) -> Signal:
        """An admitted call ended: free its slot, correct its tokens, and move the window (AIMD)."""
        if ticket.state != "admitted":
            raise ValueError(f"{self.name}: finish() of a call that is {ticket.state}, not admitted")
        ticket.state = "done"
        self.in_flight -= 1
        self.finished += 1
        admitted_at = ticket.admitted_at if ticket.admitted_at is not None else now
        if outcome.tokens is not None and admitted_at + self.limits.window > now:  # still counted in the window
            self._token_sum += outcome.tokens - ticket.tokens
            ticket.tokens = outcome.tokens
        signal = ticket.signal = self.classify(outcome)
        self.signals[signal] = self.signals.get(signal, 0) + 1
        ttft = outcome.first_token_s
        if ttft is not None and signal in ("ok", "slow_first_token"):
            # The signal is the smoothed time to first token (one slow call, a GC pause, says little), against a
            # multiple of the lowest one seen (the endpoint unloaded).
            smoothed = self.smoothed_ttft
            self.smoothed_ttft = ttft if smoothed is None else smoothed + self.limits.ttft_smoothing * (ttft - smoothed)
            self.lowest_ttft = ttft if self.lowest_ttft is None else min(self.lowest_ttft, ttft)
        if not self.limits.adaptive:
            return signal
        if signal in ("rate_limited", "server_error", "slow_first_token"):
            # One decrease per congestion episode: calls admitted before the last decrease saw the old window;
            # their bad news is already accounted for.
            if admitted_at >= self.last_decrease:
                self.window = max(self.limits.min_window, self.window / 2)
                self.threshold = self.window
                self.last_decrease = now
                self.decreases += 1
                self.smoothed_ttft = None  # judge the smaller window by its own calls
        elif signal == "ok" and (self._queued or self.in_flight + 1 >= math.floor(self.window)):
            # Grow only a window that is used (calls wait, or it was full): an idle window that grew would let a
            # burst through unchecked. Below the threshold (until the first congestion signal) the window grows by
            # one call per good call, doubling every round trip (TCP's slow start); above it, by one per window.
            step = 1.0 if self.window < self.threshold else self.limits.increase / self.window
            self.window = min(self.limits.ceiling, self.window + step)
        return signal

    def stats(self, now: float) -> EndpointStats:
        """The live figures and the counters at ``now``."""
        self._forget(now)
        oldest = max((now - t.enqueued_at for _, t in self._heap if t.state == "queued"), default=0.0)
        return EndpointStats(
            endpoint=self.name, queued=self._queued, in_flight=self.in_flight, window=self.window, limit=self.limit,
            admitted=self.admitted, finished=self.finished, wait_sum=self.wait_sum, wait_max=self.wait_max,
            oldest_wait=oldest, wait_buckets=tuple(self.wait_buckets), signals=dict(self.signals),
            decreases=self.decreases, paused_for=max(0.0, self.paused_until - now),
            requests_in_window=len(self._requests), tokens_in_window=self._token_sum,
        )


# -- the runtime side ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Grant:
    """An admitted call's slot: report how it ended with :meth:`done` (else it counts as ``failed``, no signal)."""

    ticket: Ticket
    outcome: Outcome | None = None
    retry_after: float | None = None

    def done(self, status: int | None, *, first_token_s: float | None = None, tokens: int | None = None,
             retry_after: float | None = None) -> None:
        self.outcome = Outcome(status, first_token_s, tokens)
        self.retry_after = retry_after

    @property
    def waited(self) -> float:
        return self.ticket.waited or 0.0


DecisionListener = Callable[["EndpointScheduler", str, Ticket, "Outcome | None"], None]
"""Called with (endpoint, "admitted" | "finished" | "withdrawn", ticket, outcome) for every decision."""


class EndpointScheduler:
    """Drives one :class:`EndpointPolicy` on the running loop: ``async with scheduler.slot(call, tokens)``."""

    def __init__(self, name: str, limits: EndpointLimits, listeners: list[DecisionListener] | None = None, *,
                 model: str = "", base_url: str = "") -> None:
        self.name = name
        self.model = model
        self.base_url = base_url
        self.policy = EndpointPolicy(limits, name)
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._listeners = listeners if listeners is not None else []
        self._now = 0.0

    @property
    def limits(self) -> EndpointLimits:
        return self.policy.limits

    def _notify(self, what: str, ticket: Ticket, outcome: Outcome | None = None) -> None:
        for listener in (*self._listeners, *_GLOBAL_LISTENERS):
            listener(self, what, ticket, outcome)

    def _pump(self, now: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        now = self._now = loop.time() if now is None else now
        for ticket in self.policy.admit(now):
            waiter = self._waiters.pop(ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            self._notify("admitted", ticket)
        when = self.policy.wake_at(now)
        if when is not None and when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = loop.call_at(when, self._woken)

    def _woken(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._pump()

    @asynccontextmanager
    async def slot(self, call: CallClass, tokens: int, *, since: float | None = None) -> AsyncIterator[Grant]:
        """Wait for admission, hold the slot for the body, then report the outcome the body set on the grant."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        ticket = self.policy.enqueue(call, tokens, now, since)
        self._pump(now)  # the same instant: a call that need not wait waited 0
        if ticket.state == "queued":
            waiter = self._waiters[ticket] = loop.create_future()
            try:
                await waiter
            except BaseException:
                self._waiters.pop(ticket, None)
                if ticket.state == "queued":
                    self.policy.withdraw(ticket)
                    self._notify("withdrawn", ticket)
                else:  # admitted in the same instant it was cancelled: give the slot back
                    self.policy.finish(ticket, loop.time(), Outcome(None))
                    self._pump()
                raise
        grant = Grant(ticket)
        try:
            yield grant
        finally:
            outcome = grant.outcome or Outcome(None)
            now = loop.time()
            self.policy.finish(ticket, now, outcome)
            if grant.retry_after is not None and outcome.status == 429:
                self.policy.pause(now, grant.retry_after)
            self._notify("finished", ticket, outcome)
            self._pump()

    def stats(self) -> EndpointStats:
        """The endpoint's figures now (outside a running loop: as of its last decision)."""
        try:
            self._now = asyncio.get_running_loop().time()
        except RuntimeError:
            pass
        return self.policy.stats(self._now)


# -- limits per endpoint, shared by a process's clients ------------------------------------------------------------
class Admission:
    """The schedulers of every endpoint/model a process calls, with the limits each gets.

    ``limits`` maps a model name (or ``"*"`` for the others) to its :class:`EndpointLimits`; a model in none gets
    ``default``. Every client given this object (the CLI and the server give one to all their clients) shares one
    scheduler per (base URL, model). ``listeners`` see every admission decision (OTel).
    """

    def __init__(self, limits: Mapping[str, EndpointLimits] | None = None,
                 default: EndpointLimits = EndpointLimits()) -> None:
        self.limits = dict(limits or {})
        self.default = self.limits.get("*", default)
        self._endpoints: dict[tuple[str, str], EndpointScheduler] = {}
        self.listeners: list[DecisionListener] = []
        _LIVE.add(self)

    def limits_for(self, model: str) -> EndpointLimits:
        return self.limits.get(model, self.default)

    def endpoint(self, base_url: str, model: str) -> EndpointScheduler:
        """The scheduler of ``model`` at ``base_url`` (created on first use)."""
        key = (base_url.rstrip("/"), model)
        scheduler = self._endpoints.get(key)
        if scheduler is None:
            scheduler = self._endpoints[key] = EndpointScheduler(
                f"{model}@{key[0]}", self.limits_for(model), self.listeners, model=model, base_url=key[0])
        return scheduler

    @property
    def endpoints(self) -> list[EndpointScheduler]:
        return list(self._endpoints.values())

    def stats(self) -> list[EndpointStats]:
        """Every endpoint's figures now."""
        return [e.stats() for e in self._endpoints.values()]


_LIVE: weakref.WeakSet[Admission] = weakref.WeakSet()


def live_endpoints() -> list[EndpointScheduler]:
    """Every endpoint scheduler of this process's live :class:`Admission` objects (for /metrics, OTel, the live
    view: they observe the process's model calls wherever its clients were made)."""
    return [e for admission in list(_LIVE) for e in admission.endpoints]


def add_decision_listener(listener: DecisionListener) -> Callable[[], None]:
    """Have ``listener`` see every admission decision of every live and future :class:`Admission`; returns the
    function that removes it."""
    _GLOBAL_LISTENERS.append(listener)

    def remove() -> None:
        if listener in _GLOBAL_LISTENERS:
            _GLOBAL_LISTENERS.remove(listener)

    return remove


_GLOBAL_LISTENERS: list[DecisionListener] = []


MODEL_LIMITS_ENV = "PLANWEAVE_MODEL_LIMITS"
_DEFAULT: list[Admission] = []


def set_default_admission(admission: Admission | None) -> None:
    """Make ``admission`` the one :func:`planweave.models.resolve_model` gives every client it opens (the CLI's
    ``--model-limits``); None forgets it."""
    _DEFAULT[:] = [] if admission is None else [admission]


def default_admission() -> Admission | None:
    """The process's default admission: the one set, else one read from ``$PLANWEAVE_MODEL_LIMITS`` (a model
    limits file, read once), else None (each client then keeps its own fixed limit)."""
    if not _DEFAULT:
        import os

        path = os.environ.get(MODEL_LIMITS_ENV)
        if path:
            _DEFAULT.append(load_model_limits(path))
    return _DEFAULT[0] if _DEFAULT else None


def load_model_limits(path: str | Path) -> Admission:
    """Read a model limits file (YAML or JSON): a mapping of model name (``"*"`` for the others) to limits.

    ``{"gpt-4o-mini": {"max_concurrency": 32, "tokens_per_minute": 200000, "requests_per_minute": 500}}``; keys are
    the fields of :class:`EndpointLimits` (``adaptive`` defaults to true here). Raises ValueError naming the file,
    the model and the field.
    """
    import yaml

    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"model limits file {where}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"model limits file {where}: not YAML or JSON ({exc})") from None
    return Admission(parse_model_limits(data, where))


def parse_model_limits(data: Any, where: str = "model limits") -> dict[str, EndpointLimits]:
    """Check and convert the mapping a model limits file holds (see :func:`load_model_limits`)."""
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{where}: expected a mapping of model name to limits, e.g. "
                         "{'*': {'max_concurrency': 16}}")
    fields = set(EndpointLimits.__dataclass_fields__)
    out: dict[str, EndpointLimits] = {}
    for model, options in data.items():
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where}: model names must be non-empty strings, got {model!r}")
        if not isinstance(options, Mapping):
            raise ValueError(f"{where}: model '{model}': expected a mapping of limits, got {type(options).__name__}")
        unknown = sorted(set(map(str, options)) - fields)
        if unknown:
            from planweave.core.errors import did_you_mean

            raise ValueError(f"{where}: model '{model}': unknown limit '{unknown[0]}'"
                             f"{did_you_mean(unknown[0], sorted(fields))}")
        try:
            out[model] = EndpointLimits(**{"adaptive": True, **{str(k): v for k, v in options.items()}})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: model '{model}': {exc}") from None
    return out


# -- who is calling ------------------------------------------------------------------------------------------------
_CALL: contextvars.ContextVar[CallClass] = contextvars.ContextVar("planweave_model_call")


@contextmanager
def call_context(call: CallClass) -> Iterator[None]:
    """Model calls made inside this block (in this task) are queued as ``call``."""
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)


def call_class(predicted_tokens: int | None = None) -> CallClass:
    """The class of a call about to be made: :func:`call_context`'s, else the running step's, else the default."""
    call = _CALL.get(None)
    if call is not None:
        return call
    try:
        step = current_step()
    except LookupError:
        return CallClass(predicted_tokens=predicted_tokens)
    return CallClass(priority=getattr(step, "priority", 0.0), slack=getattr(step, "slack", None),
                     predicted_tokens=predicted_tokens, run_id=step.run_id, step_id=step.step_id, purpose="llm_step")


__all__ = [
    "Admission",
    "CallClass",
    "CallTooLarge",
    "EndpointLimits",
    "EndpointPolicy",
    "EndpointScheduler",
    "EndpointStats",
    "Grant",
    "Outcome",
    "Ticket",
    "add_decision_listener",
    "call_class",
    "call_context",
    "default_admission",
    "live_endpoints",
    "load_model_limits",
    "parse_model_limits",
    "set_default_admission",
]
