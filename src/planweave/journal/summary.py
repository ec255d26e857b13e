"""Run summaries: what a list of runs shows of each run, kept by the journal so that a listing costs the runs shown.

A durable journal keeps one row per run beside its events, written in the same transaction as the events it
summarises (so it is never ahead of or behind them). The engine hands the journal each live run's
:class:`~planweave.core.state.RunState` (``Journal.track``); the group-commit writer summarises a tracked run once
per batch that carries its events (not once per event). Events written without a tracked state (another process's
``cancel`` or ``approve``, an older planweave, a generator) mark the row *stale*: the next listing folds that run
from its events and stores the result. A journal from before summaries existed is migrated the same way: every run
starts stale and the first listing folds each once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, cast

from planweave.core.errors import PlanweaveError
from planweave.core.events import Event
from planweave.core.plan.defaults import unbounded_steps
from planweave.core.plan.graph import Plan
from planweave.core.state import RunState

__all__ = [
    "ALL_RUNS",
    "ENDED",
    "PRUNABLE",
    "PRUNE_DEFAULT",
    "BatchRun",
    "PruneResult",
    "RunPage",
    "RunQuery",
    "RunSummary",
    "StoredStatus",
    "check_prunable",
    "fold_summary",
    "run_level",
    "select_page",
    "summarise",
]

#: What a summary row says of a run: the fold's status, or ``unreadable`` when its events cannot be folded.
StoredStatus = Literal["running", "succeeded", "failed", "cancelled", "unreadable"]
#: Statuses of runs that have ended (a ``run_finished`` is their last word).
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
#: Statuses ``prune`` may remove: ended runs only (never a running or interrupted one).
PRUNABLE: frozenset[str] = ENDED
#: What ``prune`` removes unless told otherwise: ``failed`` is ended but resumable, so it goes only when named.
PRUNE_DEFAULT: frozenset[str] = frozenset({"succeeded", "cancelled"})
_RUN_LEVEL = frozenset({"run_created", "run_resumed", "run_finished"})


@dataclass(frozen=True)
class RunSummary:
    """One run as a list shows it; ``seq`` orders runs by creation (the position of the run's first event)."""

    run_id: str
    status: StoredStatus
    seq: int = 0
    plan: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float | None = None
    error: str | None = None
    steps: Mapping[str, int] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)
    unbounded: Sequence[str] = ()
    tokens: int | None = None
    cost_usd: float | None = None
    owner: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def document(self) -> dict[str, Any]:
        """What the journal stores beside the indexed columns (status, times, seq, owner, source)."""
        return {"plan": self.plan, "updated_at": self.updated_at, "error": self.error, "steps": dict(self.steps),
                "waiting": dict(self.waiting), "unbounded": list(self.unbounded), "tokens": self.tokens,
                "cost_usd": self.cost_usd}

    @classmethod
    def from_row(cls, run_id: str, seq: int, status: str, started_at: float | None, finished_at: float | None,
                 owner: Mapping[str, Any] | None, source: str | None, doc: Mapping[str, Any]) -> RunSummary:
        """A summary read back from its row (``doc``: :meth:`document`)."""
        stored = cast(StoredStatus, status if status in _STORED else "unreadable")
        return cls(
            run_id, stored, seq, doc.get("plan"), started_at, finished_at, doc.get("updated_at"), doc.get("error"),
            dict(doc.get("steps") or {}), dict(doc.get("waiting") or {}),
            tuple(doc.get("unbounded") or ()), doc.get("tokens"), doc.get("cost_usd"), dict(owner or {}),
            source or "",
        )


_STORED: frozenset[str] = frozenset({"running", "succeeded", "failed", "cancelled", "unreadable"})


@dataclass(frozen=True)
class RunQuery:
    """Which runs a listing wants: newest first, only ``statuses`` (stored ones) if given, started at or after
    ``since`` (epoch seconds), created before the run at ``before`` (a cursor: a summary's ``seq``), at most
    ``limit``."""

    statuses: frozenset[str] | None = None
    since: float | None = None
    before: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"a run listing's limit must be at least 1, got {self.limit}")


@dataclass
class BatchRun:
    """What one group-commit batch says of one run: where its events sit in the batch, its summary (None: the
    batch holds events its tracked state did not apply, so the row becomes stale), and the owner and source its
    run-level events name (None: unchanged)."""

    run_id: str
    first: int
    last: int
    summary: RunSummary | None = None
    owner: Mapping[str, Any] | None = None
    source: str | None = None


#: Every run, newest first.
ALL_RUNS = RunQuery()


def check_prunable(statuses: Collection[str]) -> frozenset[str]:
    """``statuses`` as a set; raises ValueError naming any that is not an ended status (those are never pruned)."""
    wanted = frozenset(statuses)
    wrong = sorted(wanted - PRUNABLE)
    if wrong:
        raise ValueError(f"cannot prune runs that are {', '.join(wrong)}: only ended runs are pruned "
                         f"({', '.join(sorted(PRUNABLE))})")
    if not wanted:
        raise ValueError("no status to prune: give one or more of " + ", ".join(sorted(PRUNABLE)))
    return wanted


@dataclass(frozen=True)
class RunPage:
    """A page of runs, newest first; ``next`` is the cursor of the following page (None: this is the last);
    ``position``: the journal position read before the page (every event up to it is in the summaries)."""

    runs: list[RunSummary]
    next: int | None
    position: int = 0


@dataclass(frozen=True)
class PruneResult:
    """What ``Journal.prune`` removed: the runs, their events and the outputs no remaining event refers to, and
    how many bytes of stored data that was (``file_bytes_freed``: how much smaller the file became, SQLite only)."""

    runs: list[str]
    events: int
    outputs: int
    bytes_freed: int
    file_bytes_freed: int | None = None


def select_page(newest_first: Iterable[RunSummary], query: RunQuery, position: int = 0) -> RunPage:
    """The page of ``query`` among summaries given newest first (journals that filter in memory use it)."""
    shown: list[RunSummary] = []
    for summary in newest_first:
        if query.before is not None and summary.seq >= query.before:
            continue
        if query.statuses is not None and summary.status not in query.statuses:
            continue
        if query.since is not None and (summary.started_at is None or summary.started_at < query.since):
            continue
        if query.limit is not None and len(shown) == query.limit:
            return RunPage(shown, shown[-1].seq, position)
        shown.append(summary)
    return RunPage(shown, None, position)


_status_of = attrgetter("status")
_unbounded_cache: dict[int, tuple[Plan, tuple[str, ...]]] = {}


def _unbounded(plan: Plan) -> tuple[str, ...]:
    # Per plan object: a run's plan only changes with a new version, and a batch summarises it again and again.
    hit = _unbounded_cache.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    found = tuple(unbounded_steps(plan.steps[sid] for sid in plan.order))
    if len(_unbounded_cache) > 4096:
        _unbounded_cache.clear()
    _unbounded_cache[id(plan)] = (plan, found)
    return found


def summarise(state: RunState, *, updated_at: float | None, seq: int = 0, owner: Mapping[str, Any] | None = None,
              source: str = "", redact: Callable[[Any], Any] | None = None) -> RunSummary:
    """The summary of a run whose fold is ``state`` (no I/O; proportional to the run's steps); ``redact`` is applied
    to its plan name and error (a live state holds the plan as written, secrets included)."""
    counts = dict(Counter(map(_status_of, state.records.values())))  # counted in C: a summary is per batch
    waiting: dict[str, str] = {}
    if "waiting_approval" in counts or "waiting_input" in counts:
        waiting = {r.id: r.status for r in state.records.values()
                   if r.status == "waiting_approval" or r.status == "waiting_input"}
    stored = cast(StoredStatus, state.status if state.status in _STORED else "running")
    name, error = state.plan.spec.shown_name(), state.error  # a goal run: its goal
    if redact is not None:
        name, error = redact(name), redact(error)
    return RunSummary(
        state.run_id, stored, seq, name, state.created_at, state.finished_at, updated_at,
        error, counts, waiting, _unbounded(state.plan), state.tokens, round(state.cost_usd, 8),
        dict(owner or {}), source,
    )


def run_level(events: Iterable[Event]) -> tuple[Mapping[str, Any] | None, str | None]:
    """The owner (of the last ``run_created``/``run_resumed``) and the source (of ``run_created``) in ``events``;
    None for what they do not say."""
    owner: Mapping[str, Any] | None = None
    source: str | None = None
    for event in events:
        kind = event.kind
        if kind in _RUN_LEVEL and kind != "run_finished":
            owner = dict(event.data.get("owner") or {})
            if kind == "run_created":
                source = str(event.data.get("source", ""))
    return owner, source


def fold_summary(run_id: str, events: Sequence[Event], seq: int = 0) -> RunSummary:
    """The summary of a run folded from all its ``events`` (``unreadable``, saying why, if they cannot be)."""
    owner, source = run_level(events)
    updated = events[-1].at if events else None
    try:
        state = RunState.from_events(run_id, events)
    except (PlanweaveError, KeyError, TypeError, ValueError) as exc:  # a damaged run lists as unreadable, saying why
        started = events[0].at if events else None
        return RunSummary(run_id, "unreadable", seq, None, started, None, updated, f"cannot read this run: {exc}",
                          owner=dict(owner or {}), source=source or "")
    return summarise(state, updated_at=updated, seq=seq, owner=owner, source=source or "")
