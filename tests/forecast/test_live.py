"""The forecast during a run: refreshed after step outcomes, journaled as ``forecast`` events (every journal), kept
to its share of the loop, shown in the live view."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

import planweave.forecast.live as live_module
from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.cli.views import forecast_line, live_view
from planweave.core.events import PAYLOADS, Event, ForecastData
from planweave.core.state import RunState
from planweave.forecast.live import LiveForecast, LiveOptions, start_live_forecast
from planweave.journal.memory import MemoryJournal
from tests.engine.conftest import JournalAt
from tests.forecast.test_simulate import DIAMOND


def run_forecast(journal: JournalAt, options: LiveOptions) -> tuple[list[Event], str, LiveForecast | None]:
    """Run DIAMOND with a live forecast on the virtual clock; the journal's events, the run's status."""
    found: list[LiveForecast] = []

    async def go() -> str:
        async with journal.open() as opened, open_engine(opened, clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await engine.start(DIAMOND, run_id="r1")
            task = start_live_forecast(engine, run, options)
            result = await run.wait()
            found.append(await task)
            return result.status

    status = run_virtual(go())
    return journal.events("r1"), status, found[0] if found else None


def test_a_forecast_event_follows_step_outcomes_and_is_journaled(journal_at: JournalAt) -> None:
    events, status, live = run_forecast(journal_at, LiveOptions(deadline=9.0, budget_usd=2.0, runs=50, share=None))
    assert status == "succeeded"
    forecasts = [e for e in events if e.kind == "forecast"]
    outcomes = [e for e in events if e.kind in ("step_succeeded", "step_failed")]
    assert live is not None and live.refreshes == len(forecasts)
    assert 2 <= len(forecasts) <= len(outcomes) + 1  # the first at once, then after outcomes (some shared)
    first = forecasts[0].data
    assert PAYLOADS["forecast"] is ForecastData and set(ForecastData.__required_keys__) <= set(first)
    assert first["makespan"] == {"p50": 8.0, "p90": 8.0, "p99": 8.0}  # fixed estimates: the critical path
    assert (first["p_deadline"], first["p_budget"], first["critical_steps"]) == (1.0, 1.0, ["a", "b", "e"])
    after_a = next(e for e in forecasts if e.at == 2.0)  # a ended at 2: b and c run, the rest waits
    assert after_a.data["elapsed"] == 2.0 and after_a.data["makespan"]["p50"] == 8.0
    assert after_a.data["critical_steps"] == ["b", "e"]


def test_refreshes_keep_to_their_share_of_the_loop(journal_at: JournalAt, monkeypatch: pytest.MonkeyPatch) -> None:
    eager = run_forecast(journal_at, LiveOptions(deadline=9.0, runs=20, share=None))[2]
    # At once, then after each of the five outcomes but the last (the run ends while that one simulates).
    assert eager is not None and eager.refreshes == 5
    # An allowance of 1 ms at a first guess of 5 us per step and run: 40 runs of the 5-step plan fit, not 200.
    monkeypatch.setattr(live_module, "INITIAL_ALLOWANCE_S", 0.001)
    monkeypatch.setattr(live_module, "GUESS_PER_STEP_S", 5e-6)
    events, status, _ = run_forecast(JournalAt("memory://", MemoryJournal()), LiveOptions(deadline=9.0, share=1e-9))
    assert status == "succeeded"
    assert [e.data["runs"] for e in events if e.kind == "forecast"][:1] == [40]
    # No allowance and a share that grows none: nothing is forecast, and the run is as it was.
    monkeypatch.setattr(live_module, "INITIAL_ALLOWANCE_S", 0.0)
    events, status, frugal = run_forecast(JournalAt("memory://", MemoryJournal()), LiveOptions(deadline=9.0,
                                                                                             share=1e-12))
    assert status == "succeeded" and frugal is not None and frugal.refreshes == 0
    assert not [e for e in events if e.kind == "forecast"]


def test_the_live_view_shows_the_last_forecast_in_one_line() -> None:
    data: dict[str, Any] = {"runs": 200, "p_deadline": 0.82, "p_budget": 0.5, "p_success": 0.97,
                            "makespan": {"p50": 12.0, "p90": 18.5, "p99": 30.0}}
    text = forecast_line(data).plain
    assert text.startswith("forecast: in time 82% · within budget 50% · succeeds 97% · makespan p50 12")
    assert "p90 18" in text and "(200 simulated)" in text
    no_limits = forecast_line({**data, "p_deadline": None, "p_budget": None}).plain
    assert "in time" not in no_limits and "budget" not in no_limits

    events, _, _ = run_forecast(JournalAt("memory://", MemoryJournal()), LiveOptions(deadline=9.0, runs=20,
                                                                                     share=None))
    state = RunState.from_events("r1", [e for e in events if e.at <= 2.5])
    last = [e for e in events if e.kind == "forecast" and e.at <= 2.5][-1]
    out = io.StringIO()
    Console(file=out, width=160).print(live_view(state, 2.5, None, forecast=last.data))
    lines = out.getvalue().splitlines()
    # under the header; the journal held no outcome before this run: its chance of success is unknown, said so
    assert lines[1].startswith("forecast: in time 100% · succeeds: unknown (no history) · makespan p50 8")


def test_the_runs_of_one_engine_share_one_budget() -> None:
    """A server running many runs with deadlines spends its share once, not once per run."""

    async def go() -> tuple[list[LiveForecast], float, float]:
        async with open_engine("memory://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            runs = [await engine.start(DIAMOND) for _ in range(3)]
            tasks = [start_live_forecast(engine, run, LiveOptions(deadline=9.0, runs=20)) for run in runs]
            for run in runs:
                await run.wait()
            lives = [await task for task in tasks]
            for live in lives:
                await live.wait()
            budget = engine.shared[live_module.ForecastBudget]
            alone = LiveForecast(runs[0], engine.clock, None, LiveOptions(runs=20))
            return lives, budget.spent_s, alone.allowance()

    lives, shared_spent, fresh = run_virtual(go())
    assert sum(live.refreshes for live in lives) > 0
    assert shared_spent == pytest.approx(sum(live.spent_s for live in lives))
    assert fresh > 0  # a forecast made without the engine's budget has its own
