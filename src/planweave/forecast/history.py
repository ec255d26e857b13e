"""Read a journal's history into the estimates table (an adapter: it reads any :class:`Journal`).

The table is derived, never stored: :func:`read_estimates` folds the journal's newest runs (:data:`HISTORY_RUNS`;
with the engine's own fold, so plan versions, retries and fallbacks read as the engine saw them) and fits the
attempts it finds. It is recomputed on each call, so it is never stale and there is no cache to invalidate; the
cost is reading and folding those runs (docs/forecast.md gives the figure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from planweave.core.errors import PlanweaveError
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.forecast.estimates import Estimates, Observation, build_estimates
from planweave.journal.base import Journal
from planweave.journal.summary import RunQuery


def run_observations(state: RunState) -> list[Observation]:
    """The finished attempts of one run (per tool and per step fingerprint) and its model calls (per model).

    An attempt's tokens and cost are its step's model calls, shared evenly over the step's attempts. A step whose
    fallback was used ran its fallback's tool on its last attempt (the fallback is tried once).

    Per model: a call timed on its own (the planner's: ``started_at``, ``finished_at``) counts as a success of its
    duration; a step's call without its own times (an ``llm`` step's) counts with the outcome and duration of the
    attempt it was made in (a call journaled while the attempt ran), so a model whose answers fail their step
    reads as failing (the allocator's tier profiles from history, ``allocate/history.py``).
    """
    plan = state.plan
    prints = plan.fingerprints
    spent: dict[str, tuple[int, int, float]] = {}
    out: list[Observation] = []
    for call in state.model_calls:
        tin, tout = int(call.get("prompt_tokens", 0)), int(call.get("completion_tokens", 0))
        cost = float(call.get("cost_usd", 0.0))
        sid = call.get("step")
        if isinstance(sid, str):
            a, b, c = spent.get(sid, (0, 0, 0.0))
            spent[sid] = (a + tin, b + tout, c + cost)
        started, finished = call.get("started_at"), call.get("finished_at")
        if call.get("model") and isinstance(started, int | float) and isinstance(finished, int | float):
            out.append(Observation("model", str(call["model"]), max(0.0, finished - started), True, tin, tout, cost))
        elif call.get("model") and isinstance(sid, str):
            found = _attempt_of(state, sid, call.get("at"))
            if found is not None:
                duration, ok = found
                out.append(Observation("model", str(call["model"]), duration, ok, tin, tout, cost))
    # Every finished attempt: of the plan's steps, and of the steps a re-plan or repair replaced (a tool that fails
    # and gets repaired must not read as more reliable than it is); a replaced step's fingerprint is not known.
    current = [(rec, plan.steps[sid], prints[sid]) for sid, rec in state.records.items()]
    replaced = [(rec, step, None) for (_, rec), step in zip(state.retired, state.retired_steps, strict=True)]
    for rec, step, fingerprint in [*current, *replaced]:
        sid = rec.id
        attempts = [e for e in rec.attempt_log if e[2] is not None and e[3] in ("succeeded", "failed")]
        if not attempts:
            continue
        tin, tout, cost = spent.get(sid, (0, 0, 0.0))
        n = len(attempts)
        for i, (_, started, finished, outcome) in enumerate(attempts):
            fallback = step.fallback is not None and rec.fallback_active and i == n - 1
            tool = step.fallback.tool if fallback and step.fallback is not None else step.tool
            duration = max(0.0, float(finished or 0.0) - started)
            ok = outcome == "succeeded"
            # a fallback's one attempt is its tool's first; a step's later attempts are its retries
            retry = i > 0 and not fallback
            out.append(Observation("tool", tool, duration, ok, tin // n, tout // n, cost / n, retry=retry))
            if not fallback and fingerprint is not None:
                out.append(Observation("step", fingerprint, duration, ok, tin // n, tout // n, cost / n,
                                       label=f"{sid} ({tool})", retry=retry))
    return out


def _attempt_of(state: RunState, step_id: str, at: object) -> tuple[float, bool] | None:
    """The duration and outcome of step ``step_id``'s finished attempt that was running at time ``at``."""
    rec = state.records.get(step_id)
    if rec is None or not isinstance(at, int | float):
        return None
    for _, started, finished, outcome in rec.attempt_log:
        if finished is not None and outcome in ("succeeded", "failed") and started <= at <= finished:
            return max(0.0, finished - started), outcome == "succeeded"
    return None


def _by_run(events: Iterable[Event]) -> dict[str, list[Event]]:
    runs: dict[str, list[Event]] = {}
    for event in events:
        runs.setdefault(event.run_id, []).append(event)
    return runs


def estimates_from_events(events: Sequence[Event], prior: tuple[float, float] = (1.0, 1.0)) -> Estimates:
    """The estimates table of journaled ``events`` (of any number of runs); a run the fold refuses is skipped."""
    observations: list[Observation] = []
    for run_id, run_events in _by_run(events).items():
        try:
            state = RunState.from_events(run_id, run_events)
        except PlanweaveError:
            continue  # a corrupt or foreign run says nothing reliable about durations
        observations.extend(run_observations(state))
    return build_estimates(observations, prior)


HISTORY_RUNS = 200
"""How many of a journal's newest runs the table is fitted from: enough for the fits, and a bounded cost however
long the journal (folding a run costs about 10 ms per 100 steps)."""


async def read_estimates(journal: Journal, prior: tuple[float, float] = (1.0, 1.0), *,
                         runs: int | None = HISTORY_RUNS) -> Estimates:
    """The estimates table of the newest ``runs`` runs in ``journal`` (memory, SQLite or PostgreSQL; None: every
    run), recomputed now. The events are read here; they are folded and fitted in a worker thread, so a running
    engine's loop is not held up by a long history."""
    if runs is None:
        events = await journal.read()
    else:
        page = await journal.list_runs(RunQuery(limit=runs))
        events = [e for summary in reversed(page.runs) for e in await journal.read(summary.run_id)]
    return await asyncio.to_thread(estimates_from_events, events, prior)
