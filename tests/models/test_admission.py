"""Admission control for model calls: the pure policy (window, order, limits) and its drivers, over real HTTP too."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Toolbox, VirtualClock, open_engine, run_virtual
from planweave.core.context import current_step
from planweave.core.plan.critical import slacks
from planweave.journal.memory import MemoryJournal
from planweave.models import CallRefused, CompletionRequest
from planweave.models.admission import (
    Admission,
    CallClass,
    CallTooLarge,
    EndpointLimits,
    EndpointPolicy,
    Outcome,
    Ticket,
    call_class,
    call_context,
    load_model_limits,
)
from planweave.models.openai import Backoff, OpenAIChatClient, reset_server_compat
from planweave.testing import Congestion, ScriptedLLM, Text

OK = Outcome(200, first_token_s=0.1)


def policy(**limits: Any) -> EndpointPolicy:
    return EndpointPolicy(EndpointLimits(**limits), "test-model@http://x")


def call(slack: float | None = None, priority: float = 0.0, predicted: int | None = None, name: str = "") -> CallClass:
    return CallClass(priority=priority, slack=slack, predicted_tokens=predicted, step_id=name or None)


# -- the adaptive window ---------------------------------------------------------------------------------------------
def run_calls(p: EndpointPolicy, n: int, outcome: Outcome, now: float) -> float:
    """Admit and finish ``n`` calls one window at a time from ``now``; return the time after."""
    for _ in range(n):
        t = p.enqueue(call(), 10, now)
        admitted = p.admit(now)
        assert admitted == [t]
        now += 1.0
        p.finish(t, now, outcome)
    return now


def test_window_doubles_per_round_until_a_signal_then_grows_by_one_per_window() -> None:
    p = policy(max_concurrency=100, adaptive=True, initial_window=4)
    now = 0.0

    def round_trip() -> int:
        """Fill the window from a queue that never empties, let every call finish well; return how many ran."""
        nonlocal now
        tickets = [p.enqueue(call(), 10, now) for _ in range(64)]
        admitted = p.admit(now)
        now += 1
        for t in admitted:
            p.finish(t, now, OK)
        for t in tickets:
            p.withdraw(t)
        return len(admitted)

    assert [round_trip() for _ in range(3)] == [4, 8, 16]  # slow start
    first = p.enqueue(call(), 10, now)
    [first] = p.admit(now)
    p.finish(first, now, Outcome(429))
    assert p.window == 16.0 and p.threshold == 16.0  # 32 halved
    assert [round_trip() for _ in range(3)] == [16, 16, 17]  # congestion avoidance: about one more per round
    assert 18 < p.window < 19


def test_window_does_not_grow_while_unused() -> None:
    p = policy(max_concurrency=100, adaptive=True, initial_window=8)
    run_calls(p, 20, OK, 0.0)  # one call at a time: the window of 8 is never used
    assert p.window == 8


def test_window_halves_once_per_congestion_episode_on_429() -> None:
    p = policy(max_concurrency=64, adaptive=True, initial_window=16)
    tickets = [p.enqueue(call(), 10, 0.0) for _ in range(16)]
    assert len(p.admit(0.0)) == 16
    for t in tickets:  # all 16 of the same burst are rate limited: one halving, not sixteen
        p.finish(t, 1.0, Outcome(429))
    assert p.window == 8 and p.decreases == 1
    later = [p.enqueue(call(), 10, 1.0) for _ in range(8)]
    assert p.admit(1.0) == later
    p.finish(later[0], 2.0, Outcome(503))  # a call admitted after the decrease: a new episode
    assert p.window == 4 and p.decreases == 2
    assert p.signals == {"rate_limited": 16, "server_error": 1}


def test_window_halves_when_first_token_time_climbs_past_the_threshold() -> None:
    p = policy(max_concurrency=64, adaptive=True, initial_window=8, ttft_factor=2.0, ttft_smoothing=0.5)
    now = run_calls(p, 3, Outcome(200, first_token_s=0.1), 0.0)
    assert p.window == 8  # unused window: unchanged, and 0.1 s is the baseline
    signals = []
    for _ in range(3):  # smoothed: 0.1 -> 0.175 -> 0.2125 (above twice the lowest)
        t = p.enqueue(call(), 10, now)
        p.admit(now)
        now += 1
        signals.append(p.finish(t, now, Outcome(200, first_token_s=0.25)))
    # Still slow after the decrease (judged afresh, by a call admitted after it): halved again.
    assert signals == ["ok", "slow_first_token", "slow_first_token"]
    assert p.window == 2


def test_window_never_falls_below_the_minimum_nor_grows_past_max_concurrency() -> None:
    p = policy(max_concurrency=6, adaptive=True, initial_window=4, increase=5.0)
    now = 0.0
    for _ in range(10):
        tickets = [p.enqueue(call(), 1, now) for _ in range(8)]
        admitted = p.admit(now)
        assert len(admitted) <= 6
        now += 1
        for t in admitted:
            p.finish(t, now, OK)
        for t in tickets:
            p.withdraw(t)
    assert p.window == 6
    for _ in range(10):
        t = p.enqueue(call(), 1, now)
        p.admit(now)
        now += 1
        p.finish(t, now, Outcome(429))
    assert p.window == 1.0 and p.limit == 1


def test_the_window_on_the_virtual_clock_through_the_scheduler() -> None:
    """The async driver: 200 calls of 1 s each against an endpoint that refuses (429) calls past 6 in flight."""
    admission = Admission({"m": EndpointLimits(max_concurrency=64, adaptive=True, initial_window=2)})
    endpoint = admission.endpoint("http://x", "m")
    peak = serving = 0
    statuses: list[int] = []

    async def one(i: int) -> None:
        nonlocal peak, serving
        async with endpoint.slot(call(), 10) as grant:
            serving += 1  # what the endpoint sees arrive
            peak = max(peak, serving)
            status = 429 if serving > 6 else 200
            statuses.append(status)
            await asyncio.sleep(1.0 if status == 200 else 0.01)  # a refusal comes back at once
            serving -= 1
            grant.done(status, first_token_s=0.5)
        if status == 429:
            await asyncio.sleep(0.5)
            await one(i)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as tg:
            for i in range(200):
                tg.create_task(one(i))
        return loop.time()

    elapsed = run_virtual(main())
    stats = endpoint.stats()
    assert statuses.count(200) == 200 and stats.in_flight == 0 and stats.queued == 0
    assert stats.decreases >= 1  # it grew past 6, was told so, and halved
    assert statuses.count(429) < 20  # AIMD probes past the limit now and then, not all the time
    assert 2 < stats.window <= 8
    assert elapsed < 200 / 3  # far better than one at a time
    assert peak <= 8


# -- order: priority, slack, aging, predicted length ------------------------------------------------------------------
def test_critical_calls_first_then_shortest_predicted_output() -> None:
    p = policy(max_concurrency=1)
    blocker = p.enqueue(call(), 1, 0.0)
    assert p.admit(0.0) == [blocker]
    slack = p.enqueue(call(slack=5.0, name="slack"), 1, 0.0)
    long = p.enqueue(call(slack=0.0, predicted=500, name="long"), 1, 0.0)
    short = p.enqueue(call(slack=0.0, predicted=20, name="short"), 1, 0.0)
    vip = p.enqueue(call(slack=5.0, priority=1.0, name="vip"), 1, 0.0)  # priority 1 is worth 10 s of slack
    order: list[Ticket] = []
    now = 0.0
    previous = blocker
    while p.queued:
        now += 1
        p.finish(previous, now, OK)
        [previous] = p.admit(now)
        order.append(previous)
    assert order == [vip, short, long, slack]


def test_fcfs_keeps_arrival_order_whatever_the_class() -> None:
    p = policy(max_concurrency=1, order="fcfs")
    first = p.enqueue(call(slack=100.0), 1, 0.0)
    second = p.enqueue(call(slack=0.0, priority=5), 1, 1.0)
    assert p.admit(1.0) == [first]
    p.finish(first, 2.0, OK)
    assert p.admit(2.0) == [second]


def test_a_call_waiting_long_enough_goes_before_newer_critical_ones() -> None:
    p = policy(max_concurrency=1, aging=1.0)
    running = p.enqueue(call(), 1, 0.0)
    p.admit(0.0)
    patient = p.enqueue(call(slack=30.0), 1, 0.0)
    now = 0.0
    for _ in range(40):  # a critical call arrives every second and each takes a second
        p.enqueue(call(slack=0.0), 1, now)
        now += 1
        p.finish(running, now, OK)
        [running] = p.admit(now)
        if running is patient:
            break
    assert running is patient and 30.0 <= now <= 32.0


@dataclass
class Arrival:
    at: float
    slack: float
    priority: float
    tokens: int
    service: float
    status: int


arrivals = st.lists(
    st.builds(Arrival, at=st.floats(0, 50), slack=st.floats(0, 20), priority=st.sampled_from([0.0, 0.0, 1.0]),
              tokens=st.integers(1, 400), service=st.floats(0.1, 5), status=st.sampled_from([200, 200, 200, 429])),
    min_size=1, max_size=60,
)


def simulate(limits: EndpointLimits, events: Sequence[Arrival]) -> tuple[EndpointPolicy, list[Ticket], list[int]]:
    """A discrete-event run of the pure policy: arrivals, admissions and completions in time order, including the
    timer a blocked queue asks for; returns the policy, the tickets in admission order and the in-flight counts."""
    p = EndpointPolicy(limits)
    pending = sorted(events, key=lambda a: a.at)
    running: list[tuple[float, int, Ticket, Arrival]] = []
    by_ticket: dict[int, Arrival] = {}
    admitted: list[Ticket] = []
    in_flight: list[int] = []
    now, seq = 0.0, 0
    while pending or running or p.queued:
        wake = p.wake_at(now)
        next_times = [t for t in (pending[0].at if pending else None, min(running)[0] if running else None, wake)
                      if t is not None]
        assert next_times, "the queue is stuck: nothing in flight and no timer"
        now = max(now, min(next_times))
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            t = p.enqueue(CallClass(priority=a.priority, slack=a.slack), a.tokens, now)
            by_ticket[id(t)] = a
        running.sort(key=lambda r: (r[0], r[1]))
        while running and running[0][0] <= now:
            _, _, t, a = running.pop(0)
            p.finish(t, now, Outcome(a.status, 0.1, tokens=max(1, a.tokens // 2)))
        for t in p.admit(now):
            a = by_ticket[id(t)]
            seq += 1
            running.append((now + a.service, seq, t, a))
            admitted.append(t)
            in_flight.append(p.in_flight)
    return p, admitted, in_flight


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals, st.integers(1, 4), st.booleans())
def test_nothing_starves_no_later_call_overtakes_one_waiting_longer_than_the_spread(
    events: list[Arrival], concurrency: int, adaptive: bool
) -> None:
    limits = EndpointLimits(max_concurrency=concurrency, adaptive=adaptive, aging=10.0, priority_weight=10.0)
    _, admitted, _ = simulate(limits, events)
    assert len(admitted) == len(events)
    # The key spread: slack in [0, 20] and priority 0 or 1 (worth 10 s): 30 s of key, 3 s of waiting at aging 10.
    spread = (20.0 + 10.0) / limits.aging
    position = {id(t): i for i, t in enumerate(admitted)}
    for t in admitted:
        for u in admitted:
            if u.enqueued_at > t.enqueued_at + spread:
                assert position[id(u)] > position[id(t)], "a call that came later overtook one waiting too long"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals, st.integers(1, 5), st.integers(1, 8), st.integers(400, 1500), st.booleans())
def test_limits_are_never_exceeded(events: list[Arrival], concurrency: int, rpm: int, tpm: int, adaptive: bool
                                   ) -> None:
    limits = EndpointLimits(max_concurrency=concurrency, requests_per_minute=rpm * 6, tokens_per_minute=tpm * 6,
                            window=10.0, adaptive=adaptive)
    p, admitted, in_flight = simulate(limits, events)
    assert len(admitted) == len(events) and p.in_flight == 0
    assert max(in_flight) <= concurrency
    starts = [t.admitted_at for t in admitted]
    for i, t in enumerate(admitted):
        assert t.admitted_at is not None
        span = [u for u in admitted[i:] if u.admitted_at is not None and u.admitted_at < t.admitted_at + 10.0]
        assert len(span) <= rpm, f"{len(span)} requests within 10 s from {t.admitted_at} ({starts})"
        assert sum(u.tokens for u in span) <= tpm


def test_a_call_larger_than_the_token_allowance_is_refused_naming_the_limit() -> None:
    p = policy(tokens_per_minute=1000)
    with pytest.raises(CallTooLarge, match="about 1200 tokens can never fit in tokens_per_minute 1000"):
        p.enqueue(call(), 1200, 0.0)


def test_a_429_retry_after_pauses_the_endpoint_and_a_timer_wakes_it() -> None:
    p = policy(max_concurrency=4)
    t = p.enqueue(call(), 1, 0.0)
    p.admit(0.0)
    p.finish(t, 1.0, Outcome(429))
    p.pause(1.0, 2.5)
    waiting = p.enqueue(call(), 1, 1.0)
    assert p.admit(2.0) == [] and p.wake_at(2.0) == 3.5
    assert p.admit(3.5) == [waiting]


# -- who is calling -------------------------------------------------------------------------------------------------
def test_slack_is_zero_on_the_critical_path() -> None:
    # a(1) -> b(5) -> d(1); a -> c(2) -> d: c may be 3 s late.
    order = ["a", "b", "c", "d"]
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    duration = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}
    rank = {"d": 1.0, "b": 6.0, "c": 3.0, "a": 7.0}
    assert slacks(order, deps, rank, duration, 7.0) == {"a": 0.0, "b": 0.0, "c": 3.0, "d": 0.0}


def test_a_step_call_learns_its_run_priority_and_slack() -> None:
    seen: dict[str, CallClass] = {}

    async def ask(name: str) -> str:
        """Record the class a model call made here would get."""
        seen[name] = call_class()
        return name

    plan = {"steps": [
        {"id": "a", "tool": "ask", "args": {"name": "a"}, "estimate": {"duration": 1}},
        {"id": "b", "tool": "ask", "args": {"name": "b"}, "after": ["a"], "estimate": {"duration": 5}},
        {"id": "c", "tool": "ask", "args": {"name": "c"}, "after": ["a"], "estimate": {"duration": 2}},
    ]}

    async def main() -> None:
        box = Toolbox()
        box.add(ask, idempotent=True)
        async with open_engine(MemoryJournal(), tools=box, clock=VirtualClock()) as engine:
            run = await engine.start(plan, priority=2.0)
            assert (await run.wait()).ok

    run_virtual(main())
    assert {k: (v.priority, v.slack, v.run_id is not None) for k, v in seen.items()} == {
        "a": (2.0, 0.0, True), "b": (2.0, 0.0, True), "c": (2.0, 3.0, True)}
    with call_context(CallClass(priority=7.0, slack=0.0, purpose="planner")):
        assert call_class().purpose == "planner"
    assert call_class() == CallClass()
    with pytest.raises(LookupError):
        current_step()


# -- over real HTTP -------------------------------------------------------------------------------------------------
async def test_limits_hold_at_the_server_concurrency_and_requests_per_window() -> None:
    """12 calls from two clients sharing one Admission: the server's own records show at most 3 in flight and at
    most 4 arrivals in any second (less what arrivals lag admissions by: a first connection's setup)."""
    reset_server_compat()
    admission = Admission({"m": EndpointLimits(max_concurrency=3, requests_per_minute=240, window=1.0)})
    server = ScriptedLLM(default=Text("fine, thanks"), ttft=0.02, models=("m",), congestion=Congestion(knee=3,
                                                                                                       hard_limit=3))
    async with (server as base_url, OpenAIChatClient("m", base_url=base_url, admission=admission) as one,
                OpenAIChatClient("m", base_url=base_url, admission=admission) as two):
        request = CompletionRequest.of("hello", max_tokens=8)
        async with asyncio.TaskGroup() as tg:
            for i in range(12):
                tg.create_task((one if i % 2 else two).complete(request))
    served = server.served
    assert len(served) == 12
    assert all(c.status == 200 for c in served), "the server refused a call: a limit was exceeded"
    assert max(c.concurrency for c in served) <= 3
    starts = sorted(c.started for c in served)
    lag = 0.15
    for i, t in enumerate(starts):
        assert sum(1 for u in starts[i:] if u < t + 1.0 - lag) <= 4
    assert starts[-1] - starts[0] >= 2.0 - lag  # the RPM limit really spaced them: 3 windows of 4
    [stats] = admission.stats()
    assert stats.admitted == 12 and stats.queued == 0 and stats.wait_max > 0


async def test_a_call_over_the_token_limit_fails_at_the_client_naming_the_endpoint() -> None:
    admission = Admission({"m": EndpointLimits(tokens_per_minute=100)})
    async with OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1", admission=admission,
                                backoff=Backoff(attempts=1)) as client:
        with pytest.raises(CallRefused, match=r"model 'm' at http://127.0.0.1:9/v1: .*tokens_per_minute 100"):
            await client.complete(CompletionRequest.of("hello", max_tokens=500))


def test_a_model_limits_file_is_read_and_its_mistakes_named(tmp_path: Path) -> None:
    good = tmp_path / "limits.yaml"
    good.write_text("'*': {max_concurrency: 8}\ngpt-4o-mini: {max_concurrency: 32, tokens_per_minute: 200000}\n")
    admission = load_model_limits(good)
    assert admission.limits_for("gpt-4o-mini").tokens_per_minute == 200000
    assert admission.limits_for("gpt-4o-mini").adaptive  # the file's default
    assert admission.limits_for("other").max_concurrency == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("m: {max_concurency: 3}\n")
    with pytest.raises(ValueError, match=r"bad.yaml: model 'm': unknown limit 'max_concurency' \(did you mean "
                                         r"'max_concurrency'\?\)"):
        load_model_limits(bad)
    bad.write_text("m: {max_concurrency: 0}\n")
    with pytest.raises(ValueError, match="model 'm': max_concurrency must be a whole number of at least 1, got 0"):
        load_model_limits(bad)
    with pytest.raises(ValueError, match="cannot read it"):
        load_model_limits(tmp_path / "missing.yaml")
