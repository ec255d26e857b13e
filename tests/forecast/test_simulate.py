"""The forecast: exact on fixed durations (the critical path), within capacities as the engine schedules, from a
run's current state, and calibrated against real engine runs on the virtual clock."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.core.events import Event
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.core.state import RunState
from planweave.engine.runtime import DEFAULT_CONCURRENCY
from planweave.forecast.estimates import Estimates
from planweave.forecast.history import estimates_from_events, read_estimates
from planweave.forecast.simulate import ENGINE_CONCURRENCY, forecast
from planweave.journal.memory import MemoryJournal


def plan_of(doc: Mapping[str, Any]) -> Plan:
    return validate_plan(parse_plan_document(doc, "test"))


def fixed_step(sid: str, seconds: float, after: Sequence[str] = (), **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "sleep", "args": {"seconds": seconds}, "after": list(after),
            "estimate": {"duration": seconds, "cost": 0.25}, **extra}


DIAMOND = {"steps": [fixed_step("a", 2), fixed_step("b", 5, ["a"]), fixed_step("c", 1, ["a"]),
                     fixed_step("d", 3, ["c"]), fixed_step("e", 1, ["b", "d"])]}


def test_the_engine_default_concurrency_is_the_forecast_default() -> None:
    assert ENGINE_CONCURRENCY == DEFAULT_CONCURRENCY


def test_fixed_durations_forecast_exactly_the_critical_path() -> None:
    plan = plan_of(DIAMOND)
    result = forecast(plan, Estimates(), deadline=8, budget_usd=1.25, runs=200)
    assert plan.makespan_lower_bound == 8.0
    assert (result.makespan.p50, result.makespan.p90, result.makespan.p99) == (8.0, 8.0, 8.0)
    assert result.critical_steps == plan.critical_path == ("a", "b", "e")
    assert result.cost_usd.p99 == pytest.approx(1.25)
    assert (result.p_success, result.p_deadline, result.p_budget, result.p_all) == (1.0, 1.0, 1.0, 1.0)
    late = forecast(plan, Estimates(), deadline=7.5, budget_usd=1.0, runs=50)
    assert (late.p_deadline, late.p_budget, late.p_all) == (0.0, 0.0, 0.0)


def test_a_random_100_step_plan_of_fixed_durations_forecasts_its_critical_path() -> None:
    rng = random.Random(5)
    steps = []
    for i in range(100):
        parents = rng.sample([f"s{j}" for j in range(i)], min(i, rng.randint(0, 3)))
        steps.append(fixed_step(f"s{i}", round(rng.uniform(0.5, 9.0), 2), parents))
    plan = plan_of({"steps": steps})
    result = forecast(plan, Estimates(), runs=20, concurrency=None)
    assert result.makespan.p50 == result.makespan.p99 == pytest.approx(plan.makespan_lower_bound)


def test_capacities_serialise_steps_as_the_engine_would() -> None:
    doc = {"capacities": {"gpu": 1},
           "steps": [fixed_step(s, 2, resources={"gpu": 1}) for s in "abc"]}
    assert forecast(plan_of(doc), runs=5).makespan.p50 == 6.0
    assert forecast(plan_of(doc), runs=5, capacities={"gpu": 3}).makespan.p50 == 2.0
    assert forecast(plan_of({"steps": [fixed_step(s, 2) for s in "abc"]}), runs=5, concurrency=2).makespan.p50 == 4.0


def test_a_claim_beyond_every_capacity_is_refused_naming_the_step() -> None:
    with pytest.raises(ValueError, match="step 'a' claims 'gpu'"):
        forecast(plan_of({"steps": [fixed_step("a", 1, resources={"gpu": 1})]}), runs=1)


def events_of(doc: Mapping[str, Any], tools: Toolbox | None = None, runs: int = 1) -> list[Event]:
    """Run ``doc`` ``runs`` times one after the other through the real engine on the virtual clock."""

    async def go() -> list[Event]:
        journal = MemoryJournal()
        async with open_engine(journal, clock=VirtualClock(), tools=tools or builtin_tools()) as engine:
            for _ in range(runs):
                run = await engine.start(doc)
                await run.wait()
        return await journal.read()

    return run_virtual(go())


def test_from_a_runs_current_state_finished_steps_are_done_and_running_ones_have_run() -> None:
    events = events_of(DIAMOND)
    run_id = events[0].run_id
    # Cut the journal at 4 s: a finished (at 2), c finished (at 3), b running since 2, d running since 3.
    prefix = [e for e in events if e.at <= 4.0 and e.kind != "run_finished"]
    state = RunState.from_events(run_id, prefix)
    assert {s: r.status for s, r in state.records.items()} == {
        "a": "succeeded", "b": "running", "c": "succeeded", "d": "running", "e": "pending"}
    result = forecast(state, Estimates(), runs=20, now=4.0)
    assert result.elapsed == 4.0
    assert result.makespan.p50 == result.makespan.p99 == 8.0  # b ends at 7, d at 6, e at 8
    assert result.critical_steps == ("b", "e")  # what is left of the critical path
    later = forecast(state, Estimates(), runs=20, now=7.5)  # b overran its estimate: it ends now at the earliest
    assert later.makespan.p50 == 8.5


def test_a_step_that_failed_for_good_makes_success_impossible() -> None:
    doc = {"on_failure": "continue",
           "steps": [{"id": "bad", "tool": "work", "args": {"median": 1, "sigma": 0}}, fixed_step("x", 1)]}
    events = events_of(doc, noisy_tools(0, 1.0))
    state = RunState.from_events(events[0].run_id, events)
    assert forecast(state, Estimates(), runs=10).p_success == 0.0


# -- calibration against the real engine -----------------------------------------------------------------------
def noisy_tools(seed: int, p_fail: float) -> Toolbox:
    """A ``work`` tool sleeping a lognormal time (median ``median`` s, log-sd ``sigma``), failing with ``p_fail``."""
    box = builtin_tools()
    rng = random.Random(seed)

    async def work(median: float, sigma: float) -> dict[str, float]:
        """Sleep a lognormal time; fail now and then."""
        seconds = rng.lognormvariate(math.log(median), sigma)
        await asyncio.sleep(seconds)
        if rng.random() < p_fail:
            raise ConnectionError("flaked")
        return {"slept": seconds}

    box.add(work, idempotent=True)
    return box


def noisy_plan() -> dict[str, Any]:
    def work(sid: str, median: float, after: Sequence[str] = ()) -> dict[str, Any]:
        return {"id": sid, "tool": "work", "args": {"median": median, "sigma": 0.5}, "after": list(after),
                "retries": {"max": 1, "backoff": 1.0, "jitter": 0}}

    return {"capacities": {"slot": 2}, "steps": [
        work("fetch", 2.0), *(dict(work(f"map{i}", 3.0 + i, ["fetch"]), resources={"slot": 1}) for i in range(4)),
        work("join", 1.0, [f"map{i}" for i in range(4)])]}


def observed(events: Sequence[Event], deadline: float) -> tuple[float, float]:
    """The share of runs that succeeded, and that ended within ``deadline`` of their start."""
    start: dict[str, float] = {}
    ends: dict[str, tuple[float, bool]] = {}
    for e in events:
        if e.kind == "run_created":
            start[e.run_id] = e.at
        elif e.kind == "run_finished":
            ends[e.run_id] = (e.at - start[e.run_id], e.data["status"] == "succeeded")
    n = len(ends)
    return sum(ok for _, ok in ends.values()) / n, sum(t <= deadline for t, _ in ends.values()) / n


def test_forecast_is_calibrated_against_real_engine_runs() -> None:
    """Estimates learnt from 300 real runs predict how often 400 further runs end in time and succeed."""
    doc = noisy_plan()
    history = events_of(doc, noisy_tools(1, 0.1), runs=300)
    table = estimates_from_events(history)
    plan = plan_of(doc)
    fresh = events_of(doc, noisy_tools(2, 0.1), runs=400)
    for deadline in (14.0, 18.0, 24.0):
        predicted = forecast(plan, table, deadline=deadline, runs=4000, seed=3)
        ok, in_time = observed(fresh, deadline)
        assert predicted.p_deadline is not None
        # Sampling error of 400 observed runs (the forecast's 4000 add a third of it), plus the fit's: 4 sigma.
        for p_pred, p_obs in ((predicted.p_deadline, in_time), (predicted.p_success, ok)):
            tolerance = 4 * math.sqrt(max(p_obs * (1 - p_obs), 0.01) / 400 * 1.1) + 0.02
            assert abs(p_pred - p_obs) <= tolerance, (deadline, p_pred, p_obs)
    assert 0.05 < forecast(plan, table, deadline=18.0, runs=2000).p_deadline < 0.95  # type: ignore[operator]


def test_the_table_reads_from_a_journal_the_same_as_from_its_events() -> None:
    events = events_of(noisy_plan(), noisy_tools(4, 0.2), runs=20)

    async def go() -> tuple[Estimates, Estimates]:
        journal = MemoryJournal()
        for e in events:
            journal.append(e._replace(pos=None))
        await journal.flush()
        return await read_estimates(journal, runs=None), await read_estimates(journal, runs=5)

    table, newest = run_virtual(go())
    work = table.get("tool", "work")
    assert work is not None and work.n == estimates_from_events(events).table[("tool", "work")].n
    assert work.n >= 20 * 6
    assert 0.6 < work.success.mean < 0.95
    runs = list(dict.fromkeys(e.run_id for e in events))[-5:]
    last_five = [e for e in events if e.run_id in runs]
    assert newest.table[("tool", "work")].n == estimates_from_events(last_five).table[("tool", "work")].n < work.n


def test_steps_start_by_critical_path_priority_as_the_engine_orders_them() -> None:
    # Two slots: b (rank 5) and a start; when b ends, c (rank 4) goes before d (rank 1), which waited longer.
    doc = {"steps": [fixed_step("a", 4), fixed_step("b", 1), fixed_step("c", 4, ["b"]), fixed_step("d", 1)]}
    assert forecast(plan_of(doc), runs=3, concurrency=2).makespan.p50 == 5.0  # first come first served: 6


def test_overrides_replace_a_steps_model() -> None:
    from planweave.forecast.estimates import Duration, StepModel

    faster = StepModel(Duration("fixed", value=1.0), 1.0, 2.0)
    result = forecast(plan_of(DIAMOND), runs=5, overrides={"b": faster})
    assert result.makespan.p50 == 7.0  # a, c, d, e: 2 + 1 + 3 + 1
    assert result.cost_usd.p50 == pytest.approx(4 * 0.25 + 2.0)
    assert result.critical_steps == ("a", "c", "d", "e")
