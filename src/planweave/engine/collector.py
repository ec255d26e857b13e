"""Keeping Python's cyclic garbage collector off the long-lived state of many concurrent runs.

A full collection walks every tracked object. With thousands of runs in one engine (their plans, states, tasks and
futures: ~27 KiB a run) each one takes hundreds of milliseconds, and Python starts one whenever the objects that
survived younger collections grew by a quarter, which a stream of new runs keeps doing: at 10,000 concurrent runs of
sleeping steps, steps waited 0.3-1 s (p50) and 2.5-3.4 s (p99) to start, against 2-11 ms with the collector off
(``planweave bench scale``, docs/scaling.md).

:class:`CollectorPolicy` freezes (:func:`gc.freeze`) what exists after every ``freeze_every`` started runs, and
when a run of at least ``freeze_every`` steps starts (one big run's plan and state are as many objects): it
moves to the permanent generation, which collections do not walk. Objects still die by reference counting; only
cycles among frozen objects wait, so every ``thaw_after`` freezes the policy unfreezes instead (the next full
collection, one long pause, frees them and the cycle restarts), and an engine with no active run left unfreezes
(and, if it froze for many runs, collects at once: nothing is waiting to run). Small workloads (fewer runs than
``freeze_every``, each of fewer steps) never freeze. The collector is the process's: several engines in one
process share its frozen set, which only changes how much a collection walks, never what is kept alive.
"""

from __future__ import annotations

import gc

__all__ = ["DEFAULT_FREEZE_EVERY", "CollectorPolicy"]

#: Runs started between freezes unless the engine is told otherwise (``Engine(gc_freeze_every=...)``).
DEFAULT_FREEZE_EVERY = 1000


class CollectorPolicy:
    """When an engine freezes the collector's view of the heap and when it thaws it (see the module docstring)."""

    def __init__(self, freeze_every: int | None = DEFAULT_FREEZE_EVERY, thaw_after: int = 8) -> None:
        if freeze_every is not None and freeze_every < 1:
            raise ValueError(f"gc_freeze_every must be at least 1 or None, got {freeze_every}")
        if thaw_after < 1:
            raise ValueError(f"thaw_after must be at least 1, got {thaw_after}")
        self.freeze_every = freeze_every
        self.thaw_after = thaw_after
        self.started = 0
        self.frozen = 0  # freezes since the last thaw
        self.thaws = 0
        self.collect_when_idle = False  # a freeze for many runs (not only big ones) since the last idle

    def run_started(self, steps: int = 0) -> None:
        """A run of ``steps`` steps was started or resumed: every ``freeze_every`` of them, or at once for a run of
        at least ``freeze_every`` steps, freeze (or, after ``thaw_after`` freezes, thaw)."""
        if self.freeze_every is None:
            return
        self.started += 1
        # A big run alone is a heap the full collections walk again and again (its plan, state and records, built
        # just now): frozen, the 10,000-step fan-out's gen-2 collections took 34-54 ms instead of 60-144 ms
        # (docs/benchmarks.md, "The engine at the floor: the collector off a big run").
        many = not self.started % self.freeze_every
        if not many and steps < self.freeze_every:
            return
        if self.frozen >= self.thaw_after:
            self._thaw()
        else:
            gc.freeze()
            self.frozen += 1
            self.collect_when_idle |= many

    def idle(self) -> None:
        """No run is active: if anything was frozen, thaw it, and collect now (while nothing waits) if many runs
        were started meanwhile. After big runs only, the collector runs when it would have: a full collection
        then is one more for the run to pay before its result (the 10,000-step layered DAG: no faster frozen)."""
        if self.frozen:
            self._thaw()
            if self.collect_when_idle:
                gc.collect()
        self.collect_when_idle = False

    def _thaw(self) -> None:
        gc.unfreeze()
        self.frozen = 0
        self.thaws += 1
