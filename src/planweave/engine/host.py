"""What a run needs of its engine (:class:`RunHost`) and how a run ended (:class:`RunResult`).

Apart from :mod:`planweave.engine.runtime` so that the run's collaborators (emission, lifecycle, attempts, people,
plan changes, speculation hooks, step sink) can name them without importing the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from planweave.core.clock import Clock
from planweave.core.events import Event
from planweave.core.state import RunState, RunStatus
from planweave.engine.dispatch import Dispatcher
from planweave.engine.executor import Executor
from planweave.engine.protocols import PlanSeal
from planweave.journal.base import Journal

EventListener = Callable[[Event], None]


@dataclass(frozen=True)
class RunResult:
    """How a run ended: status, the error naming the root cause, per-step outputs and the ``--json`` summary."""

    run_id: str
    status: RunStatus
    error: str | None
    outputs: Mapping[str, Any]
    state: RunState = field(repr=False)

    @property
    def ok(self) -> bool:
        """Whether the run succeeded."""
        return self.status == "succeeded"

    @property
    def answer(self) -> str | None:
        """A goal run's final answer (the joiner's), or None: a plan run, or a goal run that did not succeed (its
        joiner's text, if any, is ``summary["partial_answer"]``)."""
        return self.state.answer if self.ok else None

    @cached_property
    def summary(self) -> Mapping[str, Any]:
        """The ``planweave run --json`` object (built on first use: large runs need not pay for it)."""
        return self.state.summary()


@dataclass(frozen=True, slots=True)
class RunHost:
    """What a :class:`~planweave.engine.runtime.Run` needs of its engine, and nothing more (the engine builds one and
    hands it to each run).

    ``dispatch`` queues and admits its steps within the engine-wide limits; ``executor`` performs their tool calls;
    ``listeners`` are the engine's (a run copies them when it starts); ``start_task`` starts the run's own task in
    the engine's task group and ``forget`` drops a run that ended from the engine's active runs.
    """

    clock: Clock
    journal: Journal
    executor: Executor
    dispatch: Dispatcher
    redact: Callable[[Any], Any] | None
    seal: PlanSeal | None
    max_output_bytes: int | None
    listeners: Sequence[EventListener]
    start_task: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
    forget: Callable[[str], None]
    cache: bool = True  # reuse cached outputs of cacheable steps (docs/caching.md); outputs are indexed either way
