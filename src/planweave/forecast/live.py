"""The forecast of a running run, refreshed after its step outcomes and journaled as ``forecast`` events.

A :class:`LiveForecast` listens to one run. A step outcome (``step_succeeded``, ``step_failed``) asks for a refresh;
the refresh runs in a later loop callback, never inside the engine's event emission, and keeps to a budget: after a
refresh that took ``d`` seconds of wall time the next waits at least ``d / share`` (default share 5%), so however big
the plan, forecasting takes at most that share of the loop (outcomes that arrive meanwhile share one refresh; on
the virtual clock, where a wait of real seconds would move virtual time, the next outcome after it refreshes). Each
refresh simulates ``runs`` runs (default 200: a p_deadline within about ±3.5 points) from the run's current state and
journals the result through :meth:`Run.record`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from planweave.clock import Clock, VirtualEventLoop
from planweave.engine.events import Event, EventKind, ForecastData
from planweave.engine.state import RunState
from planweave.forecast.estimates import Estimates
from planweave.forecast.simulate import ENGINE_CONCURRENCY, forecast

if TYPE_CHECKING:
    from planweave.engine.runtime import Engine, Run

_log = logging.getLogger("planweave.forecast")

_OUTCOMES = frozenset({"step_succeeded", "step_failed"})


class ForecastedRun(Protocol):
    """What a live forecast needs of a run: its state, a way to journal an event, and its events."""

    @property
    def state(self) -> RunState: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...

    def subscribe(self, listener: Any) -> None: ...


@dataclass(frozen=True)
class LiveOptions:
    """How a run's forecast is refreshed: its limits, simulated runs per refresh, the share of the loop allowed."""

    deadline: float | None = None
    budget_usd: float | None = None
    runs: int = 200
    share: float | None = 0.05  # None: refresh after every outcome, whatever it costs (tests)
    concurrency: int | None = ENGINE_CONCURRENCY
    capacities: Mapping[str, int] = field(default_factory=dict)


class LiveForecast:
    """Refreshes one run's forecast after its step outcomes (see the module docstring)."""

    def __init__(self, run: ForecastedRun, clock: Clock, estimates: Estimates | None = None,
                 options: LiveOptions = LiveOptions()) -> None:
        self._run = run
        self._clock = clock
        self.estimates = estimates or Estimates()
        self.options = options
        self.refreshes = 0
        self.spent_s = 0.0  # wall seconds spent forecasting
        self.last: ForecastData | None = None
        self._handle: asyncio.Handle | None = None
        self._next = 0.0  # time.perf_counter() before which no refresh starts
        self._closed = False
        run.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """The run's listener: an outcome asks for a refresh; the run's end cancels a pending one."""
        if event.kind in _OUTCOMES:
            self.request()
        elif event.kind == "run_finished":
            self.close()

    def request(self) -> None:
        """Ask for a refresh: in the next loop callback, or once the budget allows (one pending at a time)."""
        if self._closed or self._handle is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._next - time.perf_counter()
        if wait <= 0:
            self._handle = loop.call_soon(self._refresh)
        elif not isinstance(loop, VirtualEventLoop):
            self._handle = loop.call_later(wait, self._refresh)
        # else (virtual time, where a timer of real seconds would move the clock): the next outcome refreshes.

    def close(self) -> None:
        """Stop refreshing (the run ended)."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _refresh(self) -> None:
        self._handle = None
        if self._closed or self._run.state.status != "running":
            return
        began = time.perf_counter()
        try:
            self.refresh()
        except Exception:  # a forecast must never break the run it watches
            _log.exception("forecast of run %s failed; no more refreshes", self._run.state.run_id)
            self.close()
            return
        took = time.perf_counter() - began
        self.spent_s += took
        if self.options.share is not None:
            self._next = time.perf_counter() + took / self.options.share

    def refresh(self) -> ForecastData:
        """Forecast the run from its state now and journal it as a ``forecast`` event."""
        began = time.perf_counter()
        opts = self.options
        result = forecast(self._run.state, self.estimates, deadline=opts.deadline, budget_usd=opts.budget_usd,
                          runs=opts.runs, seed=self.refreshes, concurrency=opts.concurrency,
                          capacities=opts.capacities, now=self._clock.now())
        doc = result.to_json()
        data: ForecastData = {
            "runs": result.runs, "p_success": result.p_success, "p_deadline": result.p_deadline,
            "p_budget": result.p_budget, "p_all": result.p_all, "makespan": doc["makespan"],
            "cost_usd": doc["cost_usd"], "critical_steps": doc["critical_steps"], "deadline": result.deadline,
            "budget_usd": result.budget_usd, "elapsed": result.elapsed, "histogram": doc["histogram"],
            "overhead_s": time.perf_counter() - began,
        }
        self.refreshes += 1
        self.last = data
        self._run.record("forecast", data)
        return data


async def watch_forecast(run: ForecastedRun, clock: Clock, journal: Any, options: LiveOptions) -> LiveForecast:
    """Start forecasting ``run`` live: the first forecast from the plan's estimates at once, then, once the
    ``journal``'s history is read (a :class:`~planweave.journal.Journal`; in the caller's task), from it too."""
    from planweave.forecast.history import read_estimates

    live = LiveForecast(run, clock, None, options)
    live.request()
    live.estimates = await read_estimates(journal)
    return live


def start_live_forecast(engine: Engine, run: Run, options: LiveOptions) -> asyncio.Task[LiveForecast]:
    """Forecast ``run`` live in ``engine`` (its clock and journal), the history read in a task of the engine's."""
    return engine.spawn(watch_forecast(run, engine.clock, engine.journal, options), name=f"planweave-forecast-{run.id}")
