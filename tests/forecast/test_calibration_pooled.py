"""Forecasts that are true: a plan that has never failed reads as likely to succeed (retries modelled, evidence
pooled), an empty journal says it knows nothing of success, literal durations count, and on held-out runs the
forecast scores better (Brier) than the naive baseline."""

from __future__ import annotations

from pathlib import Path

import yaml

from planweave import builtin_tools
from planweave.bench.forecast_calibration import calibration
from planweave.core.clock import VirtualClock, run_virtual
from planweave.core.events import Event
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.engine.runtime import Engine
from planweave.forecast.history import estimates_from_events
from planweave.forecast.simulate import forecast
from planweave.journal import MemoryJournal

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.yaml"


def hello_runs(history: list[Event], n: int) -> list[str]:
    """Run hello.yaml ``n`` times on the virtual clock; their events are added to ``history``."""
    async def go() -> list[str]:
        statuses: list[str] = []
        journal = MemoryJournal()
        async with Engine(journal, clock=VirtualClock(), tools=builtin_tools()) as engine:
            for _ in range(n):
                run = await engine.start(yaml.safe_load(HELLO.read_text()))
                statuses.append((await run.wait()).status)
            history.extend(await journal.read())
        return statuses

    return run_virtual(go())


def hello_plan() -> Plan:
    return validate_plan(parse_plan_document(yaml.safe_load(HELLO.read_text())), builtin_tools())


def test_hello_forecast_after_three_and_ten_successful_runs() -> None:
    history: list[Event] = []
    plan = hello_plan()
    empty = forecast(plan, estimates_from_events([]), deadline=5, runs=500)
    assert not empty.success_known and empty.to_json()["p_success"] is None
    assert empty.makespan.p50 == 0.9  # fetch_b's literal 0.9 s, not "0s"
    assert set(empty.untimed) == {"greet", "flaky", "combine", "report"}

    assert hello_runs(history, 3) == ["succeeded"] * 3
    three = forecast(plan, estimates_from_events(history), deadline=5, runs=2000)
    assert three.success_known and three.p_success >= 0.75, three.p_success

    assert hello_runs(history, 7) == ["succeeded"] * 7
    ten = forecast(plan, estimates_from_events(history), deadline=5, runs=2000)
    assert ten.p_success >= 0.85, ten.p_success
    assert ten.p_success > three.p_success  # more successes, more confidence


def test_a_step_that_fails_once_by_design_reads_as_succeeding_on_its_retry() -> None:
    history: list[Event] = []
    hello_runs(history, 5)
    table = estimates_from_events(history)
    plan = hello_plan()
    flaky = plan.steps["flaky"]
    model = table.step_model(flaky, plan.fingerprints["flaky"])
    assert model.p_success < 0.5  # its first attempt fails every time
    assert model.p_retry is not None and model.p_retry > 0.9  # and its retry succeeds every time


def test_held_out_brier_scores_beat_the_flat_prior_and_match_the_plans_own_rate() -> None:
    report = calibration(plans=8, train_runs=10, test_runs=10, seed=3, forecast_runs=1000)
    assert report.forecasts == 8 * 10
    # lower is better: the pooled forecast beats the earlier flat prior per attempt, on a plan's own history and
    # on a plan that never ran (forecast from the other plans' runs of the same tools) ...
    assert report.brier < report.brier_flat, report
    assert report.brier_unseen < report.brier_unseen_flat, report
    # ... and does as well as the plan's own success rate, which needs the plan to have run before
    assert report.brier <= report.brier_plan_rate + 0.01, report
