"""The forecast of a running run, refreshed after its step outcomes and journaled as ``forecast`` events.

A :class:`LiveForecast` listens to one run. A step outcome (``step_succeeded``, ``step_failed``) asks for a refresh;
the refresh snapshots the run in a later loop callback (never inside the engine's event emission) and simulates in a
worker thread, so the loop keeps dispatching meanwhile (the thread still takes the GIL). Refreshes keep to a budget
of wall time (:class:`ForecastBudget`, one per engine, shared by its runs' forecasts): :data:`INITIAL_ALLOWANCE_S`
plus ``share`` (default 5%) of the time since the budget was made, less what refreshes spent. A refresh simulates
``runs`` runs (default 200: a p_deadline within about ±3.5 points) from the run's current state, or fewer (at least
:data:`MIN_RUNS`) when the budget allows only those, at the cost per run the previous refresh measured; when not
even those fit, it waits for the budget to grow (outcomes that arrive meanwhile share it; on the virtual clock,
where a wait of real seconds would move virtual time, the next outcome after it asks again). So however big the
plan and however many runs, forecasting takes about that share of the loop. Each refresh is journaled through
:meth:`Run.record`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from planweave.core.clock import Clock, VirtualEventLoop
from planweave.core.events import Event, EventKind, ForecastData
from planweave.core.state import RunState
from planweave.forecast.estimates import Estimates
from planweave.forecast.simulate import ENGINE_CONCURRENCY, Forecast, RunSnapshot, forecast, snapshot

if TYPE_CHECKING:
    from planweave.engine.runtime import Engine, Run

_log = logging.getLogger("planweave.forecast")

_OUTCOMES = frozenset({"step_succeeded", "step_failed"})

MIN_RUNS = 20
"""The fewest simulated runs a refresh does (a p_deadline within about ±11 points); fewer are not worth journaling."""

INITIAL_ALLOWANCE_S = 0.01
"""Wall seconds the first refreshes may spend before the share of the run's time has grown any allowance."""

GUESS_PER_STEP_S = 1e-5
"""Wall seconds one step of one simulated run costs, as a first guess (measured: 5-15 us, by machine load)."""


class ForecastBudget:
    """Wall time the live forecasts sharing it may spend: :data:`INITIAL_ALLOWANCE_S`, plus ``share`` of the time
    since it was made, less what they spent. One per engine (:func:`start_live_forecast`), so that a server running
    a hundred runs with deadlines spends ``share`` of its time on their forecasts, not a hundred times that."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.began = time.perf_counter()
        self.spent_s = 0.0

    def allowance(self) -> float:
        return INITIAL_ALLOWANCE_S + self.share * (time.perf_counter() - self.began) - self.spent_s


class ForecastedRun(Protocol):
    """What a live forecast needs of a run: its state, a way to journal an event, and its events."""

    @property
    def state(self) -> RunState: ...

    def record(self, kind: EventKind, data: Mapping[str, Any], step: str | None = None) -> None: ...

    def subscribe(self, listener: Callable[[Event], None]) -> None: ...


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
                 options: LiveOptions = LiveOptions(), *,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None,
                 budget: ForecastBudget | None = None) -> None:
        """``spawn`` starts each refresh's task (default: a task of the running loop; the CLI and the server give
        the engine's, so that closing the engine cancels it); ``budget``: the wall time shared with other runs'
        forecasts (default: one of its own at ``options.share``; none with ``share`` None)."""
        self._run = run
        self._clock = clock
        self.estimates = estimates or Estimates()
        self.options = options
        self.refreshes = 0
        self.spent_s = 0.0  # wall seconds spent forecasting
        self.last: ForecastData | None = None
        self._spawn = spawn
        self._tasks: set[asyncio.Task[None]] = set()
        self._handle: asyncio.Handle | None = None
        self._busy = False  # a refresh is simulating (in a thread)
        self._again = False  # an outcome arrived meanwhile: refresh once more after it
        self._budget = budget if budget is not None or options.share is None else ForecastBudget(options.share)
        # Wall seconds one simulated run costs: a guess from the plan's size until the first refresh measures it.
        self._per_run = GUESS_PER_STEP_S * max(1, len(run.state.plan.order))
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
        if self._busy:
            self._again = True
            return
        loop = asyncio.get_running_loop()
        budget = self._budget
        missing = 0.0 if budget is None else MIN_RUNS * self._per_run - budget.allowance()
        if missing <= 0:
            self._handle = loop.call_soon(self._refresh)
        elif budget is not None and not isinstance(loop, VirtualEventLoop):
            self._handle = loop.call_later(missing / budget.share, self._refresh)
        # else (virtual time, where a timer of real seconds would move the clock): the next outcome refreshes.

    def allowance(self) -> float:
        """Wall seconds a refresh may spend now, from its :class:`ForecastBudget` (unbounded with ``share`` None)."""
        return float("inf") if self._budget is None else self._budget.allowance()

    def affordable_runs(self) -> int:
        """Simulated runs the next refresh does: ``runs``, or fewer (at least :data:`MIN_RUNS`) within the allowance."""
        if self._budget is None:
            return self.options.runs
        return max(MIN_RUNS, min(self.options.runs, int(self.allowance() / self._per_run)))

    def close(self) -> None:
        """Stop refreshing (the run ended): a pending refresh is cancelled, one simulating is not journaled."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    async def wait(self) -> None:
        """Return once no refresh is simulating (tests and benchmarks read the figures after)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _refresh(self) -> None:
        """Snapshot the run now, in the loop, and simulate it in a task that waits for a worker thread."""
        self._handle = None
        if self._closed or self._run.state.status != "running":
            return
        self._busy = True
        work = self._simulate(snapshot(self._run.state, self._clock.now()), self.affordable_runs())
        try:
            task = self._spawn(work) if self._spawn is not None else asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # the engine is closing: no more refreshes
            work.close()
            self._busy = False
            self.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _simulate(self, snap: RunSnapshot, runs: int) -> None:
        opts = self.options
        began = time.perf_counter()
        try:
            # In a worker thread: the loop keeps dispatching while it simulates (on the virtual clock, time waits).
            result = await asyncio.get_running_loop().run_in_executor(None, functools.partial(
                forecast, snap, self.estimates, deadline=opts.deadline, budget_usd=opts.budget_usd, runs=runs,
                seed=self.refreshes, concurrency=opts.concurrency, capacities=opts.capacities))
        except Exception:  # a forecast must never break the run it watches
            _log.exception("forecast of run %s failed; no more refreshes", self._run.state.run_id)
            self.close()
            return
        finally:
            self._busy = False
        took = time.perf_counter() - began
        self.spent_s += took
        if self._budget is not None:
            self._budget.spent_s += took
        self._per_run = took / runs
        if self._closed or self._run.state.status != "running":
            return  # the run ended meanwhile: its last forecast would come after its end
        self._record(result, took)
        if self._again:
            self._again = False
            self.request()

    def _record(self, result: Forecast, took: float) -> None:
        doc = result.to_json()
        data: ForecastData = {
            "runs": result.runs, "p_success": doc["p_success"], "p_deadline": result.p_deadline,
            "p_budget": result.p_budget, "p_all": doc["p_all"], "makespan": doc["makespan"],
            "cost_usd": doc["cost_usd"], "critical_steps": doc["critical_steps"], "deadline": result.deadline,
            "budget_usd": result.budget_usd, "elapsed": result.elapsed, "histogram": doc["histogram"],
            "overhead_s": took,
        }
        self.refreshes += 1
        self.last = data
        self._run.record("forecast", data)


HISTORY_MAX_AGE_S = 30.0
"""How long (wall seconds) the estimates read from one journal serve the live forecasts of the runs started
after: a server starting many runs a second reads the journal's history once, not once per run."""

_history: dict[int, tuple[Any, Estimates, float]] = {}  # id(journal) -> (journal, table, time.monotonic() read)


async def journal_estimates(journal: Any) -> Estimates:
    """The estimates table of ``journal`` (a :class:`~planweave.journal.Journal`), read again when older than
    :data:`HISTORY_MAX_AGE_S`."""
    from planweave.forecast.history import read_estimates

    cached = _history.get(id(journal))
    if cached is not None and cached[0] is journal and time.monotonic() - cached[2] < HISTORY_MAX_AGE_S:
        return cached[1]
    table = await read_estimates(journal)
    _history[id(journal)] = (journal, table, time.monotonic())
    return table


async def watch_forecast(run: ForecastedRun, clock: Clock, journal: Any, options: LiveOptions, *,
                         spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None,
                         budget: ForecastBudget | None = None) -> LiveForecast:
    """Start forecasting ``run`` live: the first forecast from the plan's estimates at once, then, once the
    ``journal``'s history is read (a :class:`~planweave.journal.Journal`; in the caller's task), from it too."""
    live = LiveForecast(run, clock, None, options, spawn=spawn, budget=budget)
    live.request()
    live.estimates = await journal_estimates(journal)
    return live


def start_live_forecast(engine: Engine, run: Run, options: LiveOptions) -> asyncio.Task[LiveForecast]:
    """Forecast ``run`` live in ``engine`` (its clock and journal), the history read and every refresh simulated in
    tasks of the engine's."""
    budget = None
    if options.share is not None:
        budget = engine.shared.get(ForecastBudget)  # the runs of one engine share one budget
        if budget is None:
            budget = engine.shared[ForecastBudget] = ForecastBudget(options.share)
    return engine.spawn(watch_forecast(run, engine.clock, engine.journal, options, spawn=engine.spawn,
                                       budget=budget), name=f"planweave-forecast-{run.id}")
