"""The control loop on the virtual clock: tick timing, chunks realigned on arrival, late chunks refused, the safe
hold, the budget, and a crashed control run resumed from its journal.

The constructed environment records what it was told; the constructed policy's action for tick ``k`` is the number
``k`` itself, so a correctly aligned chunk runs action ``k`` at tick ``k``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planweave.control import ChunkRequest, ControlError, ControlLoop, ControlReport, DropExpired, replay_splices
from planweave.core.clock import RealClock, run_virtual
from planweave.core.events import Event
from planweave.journal import open_journal
from planweave.journal.memory import MemoryJournal

HOLD = -1.0


class Recorder:
    """An environment that only records the actions it gets, the time it got them, and its position."""

    def __init__(self, slow_at: dict[int, float] | None = None, crash_at: int | None = None) -> None:
        self.actions: list[tuple[int, float, Any]] = []
        self.slow_at = slow_at or {}
        self.crash_at = crash_at
        self.position = 0.0
        self.tick = 0

    def observe(self) -> float:
        return self.position

    async def act(self, action: Any, dt: float) -> None:
        loop = asyncio.get_running_loop()
        self.actions.append((self.tick, loop.time(), action))
        if self.tick == self.crash_at:
            raise RuntimeError("simulated crash")
        self.position += 1.0
        self.tick += 1
        if self.tick - 1 in self.slow_at:
            await asyncio.sleep(self.slow_at[self.tick - 1])

    def snapshot(self) -> dict[str, Any]:
        return {"position": self.position, "tick": self.tick}

    def restore(self, state: dict[str, Any]) -> None:
        self.position, self.tick = state["position"], state["tick"]


class TickPolicy:
    """Answers after ``latency`` s with the actions ``start_tick, start_tick + 1, ...``; records each request."""

    def __init__(self, latency: float | Sequence[float]) -> None:
        self.latencies = latency
        self.requests: list[ChunkRequest] = []

    async def __call__(self, request: ChunkRequest) -> list[float]:
        self.requests.append(request)
        latency = self.latencies if isinstance(self.latencies, float | int) else self.latencies[request.chunk]
        await asyncio.sleep(latency)
        return [float(request.start_tick + i) for i in range(request.horizon)]


def run(loop: ControlLoop, ticks: int, **kwargs: Any) -> ControlReport:
    return run_virtual(loop.run(until=lambda position: position >= ticks, **kwargs))


def test_ticks_run_at_the_rate_with_no_lateness_on_the_virtual_clock() -> None:
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.05), rate_hz=50, horizon=8, execute=4,
                             safe_action=HOLD), ticks=40)
    assert report.ticks == 40 and report.missed == 0 and report.max_lateness == 0.0
    assert [round(at, 9) for _, at, _ in env.actions] == [round(k * 0.02, 9) for k in range(40)]


def test_a_missed_tick_is_journaled_never_silently_skipped() -> None:
    env = Recorder(slow_at={5: 0.05})  # acting at tick 5 (at 0.10 s) takes 50 ms: tick 6 (due 0.12) passes
    journal = MemoryJournal("memory://")
    report = run(ControlLoop(env=env, policy=TickPolicy(0.01), rate_hz=50, horizon=8, execute=4,
                             safe_action=HOLD, journal=journal), ticks=20)
    missed = run_virtual(journal.read(report.run_id, kind="control_tick_missed"))
    assert [(e.data["tick"], round(e.data["lateness_s"], 9)) for e in missed] == [(6, 0.03)]
    assert report.missed == 1
    assert [r.tick for r in report.trace][4:8] == [4, 5, 7, 8]
    assert report.trace[6].lateness == pytest.approx(0.01)  # tick 7 is due at 0.14, run at 0.15
    assert report.trace[7].lateness == pytest.approx(0.0)  # and the loop is back on time


def test_drop_expired_runs_each_action_at_the_tick_it_was_meant_for() -> None:
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.07), rate_hz=50, horizon=10, execute=4,
                             safe_action=HOLD), ticks=60)
    ran = [(t, a) for t, _, a in env.actions if a != HOLD]
    assert ran and all(a == t for t, a in ran)
    # 70 ms is 3.5 ticks: each chunk arrives during its 4th tick and is first used at the 5th, 4 actions expired
    assert {s.dropped for s in report.splices} == {4}
    assert report.discarded == 4 * len(report.splices)


def test_rollforward_asks_for_the_chunk_at_the_tick_it_will_arrive_and_drops_nothing() -> None:
    env = Recorder()
    policy = TickPolicy(0.07)
    report = run(ControlLoop(env=env, policy=policy, rate_hz=50, horizon=10, execute=4, realign="rollforward",
                             model=lambda position, action: position + 1.0, latency_hint_s=0.07,
                             safe_action=HOLD), ticks=60)
    later = policy.requests[1:]
    assert later and all(r.start_tick == r.tick + 4 for r in later)
    assert all(r.obs == r.tick + 4 for r in later)  # the position rolled forward by the 4 pending actions
    assert sum(s.dropped for s in report.splices) == 0
    assert all(a == t for t, _, a in env.actions if a != HOLD)


def test_nearest_realigns_in_the_loop() -> None:
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.07), rate_hz=50, horizon=10, execute=4, realign="nearest",
                             distance=lambda position, waypoint: abs(position - waypoint), safe_action=HOLD), ticks=40)
    # positions equal ticks here, so the nearest waypoint is the current tick's, and the next one runs
    assert all(s.dropped == 5 for s in report.splices)


def test_a_chunk_older_than_the_bound_is_refused_and_the_safe_action_held() -> None:
    env = Recorder()
    journal = MemoryJournal("memory://")
    policy = TickPolicy([0.05, 0.3, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])
    report = run(ControlLoop(env=env, policy=policy, rate_hz=50, horizon=8, execute=4, max_age_s=0.2,
                             safe_action=HOLD, journal=journal), ticks=40)
    assert report.refused == 1
    events = run_virtual(journal.read(report.run_id))
    refused = [e.data for e in events if e.kind == "control_chunk_refused"]
    assert [(r["chunk"], r["age_s"]) for r in refused] == [(1, pytest.approx(0.3))]
    holds = [e.data for e in events if e.kind == "control_hold"]
    assert holds[0]["reason"] == "no chunk yet"
    assert any(h["reason"] == "last chunk refused as too old" for h in holds[1:])
    # chunk 0's 8 actions ran out while chunk 1 was computed: the executor held, it did not reuse an old action
    held = [t for t, _, a in env.actions if a == HOLD]
    assert held[:3] == [0, 1, 2] and len(held) > 10


def test_sync_mode_stops_to_infer_and_counts_the_idle_ticks() -> None:
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.1), rate_hz=50, horizon=8, execute=4, mode="sync",
                             safe_action=HOLD), ticks=45)
    # each cycle: 5 ticks waiting (100 ms) + 4 executing
    assert report.idle_ticks == 25 and report.idle_frac == pytest.approx(25 / 45)
    assert report.discarded == 0


def test_the_budget_of_model_calls_ends_the_run() -> None:
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.02), rate_hz=50, horizon=8, execute=8, max_calls=3,
                             safe_action=HOLD), ticks=1000)
    assert report.status == "budget" and report.requested == 3 and report.ticks < 40


def test_the_deadline_ends_the_run() -> None:
    report = run(ControlLoop(env=Recorder(), policy=TickPolicy(0.02), rate_hz=50, horizon=8, execute=4,
                             safe_action=HOLD), ticks=10_000, deadline=1.0)
    assert report.status == "deadline" and report.ticks == 50


def test_a_monitor_event_replaces_the_chunk_in_flight() -> None:
    env = Recorder()
    policy = TickPolicy(0.1)
    report = run(ControlLoop(env=env, policy=policy, rate_hz=50, horizon=20, execute=4, safe_action=HOLD,
                             monitor=lambda position: position == 12.0), ticks=40)
    assert report.cancelled == 1
    assert [r.tick for r in policy.requests][:4] == [0, 5, 10, 12]  # the one asked at 10 is replaced at 12


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"horizon": 0}, "horizon=0: must be at least 1"),
    ({"execute": 9}, "execute=9: must be between 1 and horizon=8"),
    ({"rate_hz": 0}, "rate_hz=0: must be a positive number"),
    ({"realign": "rollforward"}, "needs a model"),
    ({"realign": "nearst"}, "realign 'nearst' is not known"),
])
def test_bad_settings_are_named(kwargs: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"rate_hz": 50, "horizon": 8, "execute": 4, **kwargs}
    with pytest.raises(ControlError, match=message):
        ControlLoop(env=Recorder(), policy=TickPolicy(0.01), **settings)


def test_a_policy_that_fails_is_named_with_its_chunk() -> None:
    async def broken(request: ChunkRequest) -> list[float]:
        raise ValueError("model offline")

    with pytest.raises(ControlError, match=r"the policy failed on chunk 0 .*model offline"):
        run(ControlLoop(env=Recorder(), policy=broken, rate_hz=50, horizon=8, execute=4), ticks=10)


def test_the_journaled_splices_replay_to_the_same_alignments() -> None:
    journal = MemoryJournal("memory://")
    report = run(ControlLoop(env=Recorder(), policy=TickPolicy([0.03, 0.07, 0.11] * 10), rate_hz=50, horizon=10,
                             execute=4, safe_action=HOLD, journal=journal), ticks=60)
    events: list[Event] = run_virtual(journal.read(report.run_id))
    replayed = replay_splices(events, DropExpired())
    assert [(a.start_tick, a.dropped) for a in replayed] == [(s.kept_from, s.dropped) for s in report.splices]
    assert len({a.dropped for a in replayed}) > 1


def test_a_crashed_control_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    crashed = Recorder(crash_at=57)

    def loop(env: Recorder) -> ControlLoop:
        return ControlLoop(env=env, policy=TickPolicy(0.05), rate_hz=50, horizon=8, execute=4, safe_action=HOLD,
                           journal=url, checkpoint_every=25)

    with pytest.raises(ControlError, match="the environment failed at tick 57: RuntimeError: simulated crash"):
        run(loop(crashed), ticks=100, run_id="arm-1")
    fresh = Recorder()  # a new process: the simulation's state comes back from the journal
    report = run(loop(fresh), ticks=100, resume="arm-1")
    assert report.resumed_at == 50  # the checkpoint after tick 49
    assert fresh.actions[0][0] == 50 and report.ticks == 100  # ticks before the crash count once
    # the plan starts empty: the first ticks hold while a fresh chunk is inferred from the restored state
    assert [a for _, _, a in fresh.actions[:3]] == [HOLD, HOLD, HOLD]
    assert fresh.actions[3][2] == 53.0

    async def kinds() -> list[Any]:
        async with open_journal(url) as journal:
            return [(e.kind, e.data.get("resumed")) for e in await journal.read("arm-1")
                    if e.kind in ("control_started", "control_finished")]

    assert run_virtual(kinds()) == [("control_started", False), ("control_started", True), ("control_finished", None)]
    with pytest.raises(ControlError, match="cannot resume control run 'arm-1': it finished"):
        run(loop(Recorder()), ticks=100, resume="arm-1")


@settings(max_examples=40, deadline=None)
@given(latencies=st.lists(st.integers(1, 30), min_size=1, max_size=12), horizon=st.integers(2, 12),
       execute=st.integers(1, 12), rollforward=st.booleans())
def test_every_tick_runs_the_action_meant_for_it_or_holds(latencies: list[int], horizon: int, execute: int,
                                                          rollforward: bool) -> None:
    """Whatever the latencies (in ms, jittering chunk to chunk), no action ever runs at a tick it was not for, no
    tick is skipped, and each arrived chunk's actions are either run, superseded or counted as discarded."""
    execute = min(execute, horizon)
    env = Recorder()
    policy = TickPolicy([latencies[i % len(latencies)] / 1000 * 3 for i in range(200)])
    extra: dict[str, Any] = ({"realign": "rollforward", "model": lambda p, a: p + 1.0, "latency_hint_s": 0.03}
                             if rollforward else {})
    report = run(ControlLoop(env=env, policy=policy, rate_hz=50, horizon=horizon, execute=execute,
                             safe_action=HOLD, **extra), ticks=50)
    assert [t for t, _, _ in env.actions] == list(range(50)) and report.missed == 0
    assert all(a == t for t, _, a in env.actions if a != HOLD)
    ran = sum(1 for _, _, a in env.actions if a != HOLD)
    arrived = sum(horizon for s in report.splices)
    assert ran + report.discarded + report.superseded <= arrived
    assert report.idle_ticks == 50 - ran


@pytest.mark.postgres
def test_a_control_run_resumes_from_a_postgresql_journal(durable_url: str) -> None:
    """The same on the real clock (the virtual one does not wait for a socket's answer, so a flush to PostgreSQL
    would let it run ahead): tick numbers may differ from the environment's on a busy machine, so what is checked is
    the checkpoint, the restored state and the fresh start."""
    crashed = Recorder(crash_at=57)

    def loop(env: Recorder) -> ControlLoop:
        return ControlLoop(env=env, policy=TickPolicy(0.05), rate_hz=50, horizon=8, execute=4, safe_action=HOLD,
                           journal=durable_url, checkpoint_every=25, clock=RealClock())

    with pytest.raises(ControlError, match="simulated crash"):
        asyncio.run(loop(crashed).run(until=lambda position: position >= 80, run_id="arm-pg"))
    fresh = Recorder()
    report = asyncio.run(loop(fresh).run(until=lambda position: position >= 80, resume="arm-pg"))

    async def checkpoints() -> list[Any]:
        async with open_journal(durable_url) as journal:
            return [e.data for e in await journal.read("arm-pg", kind="control_checkpoint")]

    first_after = [c for c in run_virtual(checkpoints()) if c["tick"] < (report.resumed_at or 0)][-1]
    assert report.resumed_at == first_after["tick"] + 1
    assert fresh.actions[0][0] == first_after["state"]["tick"]  # the environment continued from its snapshot
    assert fresh.actions[0][2] == HOLD and report.status == "done"
