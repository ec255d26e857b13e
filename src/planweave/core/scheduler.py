"""Admission decisions: which ready steps start now, by critical-path priority within capacities (pure).

Priority: a step's key is ``aging * ready_at - rank``; the smallest key starts first. So the step with the longest
remaining critical path goes first, and every second a step waits counts like ``aging`` seconds of critical path,
so nothing starves. A step starts only when its claims and a concurrency slot fit. Claims are amounts of named
capacities plus read/write locks on named resources (files, tables...): readers share a resource, a writer holds it
alone. When the best step does not fit, lower-priority steps may start ahead of it only if they claim none of the
resources it is waiting for (they cannot delay it), so a large claim or a writer is never starved by a stream of
small claims or readers.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from planweave.core.plan.model import Claim

T = TypeVar("T")



class CapacityExceeded(ValueError):
    """A claim can never fit: it is larger than the capacity it claims from."""


class Scheduler(Generic[T]):
    """A priority queue of ready items plus the capacities they are admitted against."""

    def __init__(
        self,
        concurrency: int | None = None,
        capacities: Mapping[str, int] | None = None,
        *,
        aging: float = 1.0,
        scan_limit: int = 256,
    ) -> None:
        self.concurrency = concurrency
        self.capacities = dict(capacities or {})
        self.aging = aging
        self.scan_limit = scan_limit
        self.in_use: dict[str, int] = {name: 0 for name in self.capacities}
        self.readers: dict[str, int] = {}
        self.writers: set[str] = set()
        self.running = 0
        self._heap: list[tuple[float, int, T, Claim | None]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def has_waiting(self) -> bool:
        """Whether any item is queued (admitted items are not: they hold a slot until released)."""
        return bool(self._heap)

    def try_start_now(self, claim: Claim | None, batch: int = 1) -> bool:
        """Take a slot for an item without queueing it, if nothing can order it: True means it holds one now.

        The fast path for a claim-free item when nothing waits: queueing it would only pop it again at once.
        ``batch`` counts it and the items made ready together after it; it starts now only if all of them would
        get a slot, so that otherwise they all queue and start by priority.
        """
        limit = self.concurrency
        if claim is None and not self._heap and (limit is None or self.running + batch <= limit):
            self.running += 1
            return True
        return False

    def try_take_spare(self, claim: Claim | None) -> bool:
        """Take a slot for a speculative item only if no queued item could want it: True means it holds one now.

        Speculation runs on spare capacity alone: nothing may be waiting (a waiting item would have first claim on
        every slot), a concurrency slot must be free and the claims must fit. The caller gives the slot back with
        :meth:`release`, and takes it back early (preempts) when :meth:`needs_back` says a waiting item needs it.
        """
        if self._heap or (self.concurrency is not None and self.running >= self.concurrency):
            return False
        if claim is not None:
            if any(name not in self.capacities for name in claim.amounts) or not self._fits(claim):
                return False
            self._take(claim)
        self.running += 1
        return True

    def needs_back(self, claim: Claim | None) -> bool:
        """Whether giving back a slot held with ``claim`` could let a waiting item start (the queue is not empty and
        the concurrency is full, or a waiting item claims something ``claim`` holds)."""
        if not self._heap:
            return False
        if self.concurrency is not None and self.running >= self.concurrency:
            return True
        if claim is None:
            return False
        names = claim.names()
        return any(entry[3] is not None and not names.isdisjoint(entry[3].names()) for entry in self._heap)

    def adopt(self, capacities: Mapping[str, int]) -> None:
        """Add capacities not known yet (a plan brings its own); a known one keeps its amount."""
        for name, amount in capacities.items():
            if name not in self.capacities:
                self.capacities[name] = amount
                self.in_use[name] = 0

    def push(self, item: T, *, rank: float, ready_at: float, claim: Claim | None = None) -> None:
        """Queue an item that is ready; ``claim`` None means it needs only a concurrency slot."""
        for name, amount in claim.amounts.items() if claim else ():
            if name not in self.capacities:
                raise CapacityExceeded(f"claim on '{name}', which has no capacity")
            if amount > self.capacities[name]:
                raise CapacityExceeded(f"claim of {amount} on '{name}' exceeds its capacity {self.capacities[name]}")
        heapq.heappush(self._heap, (self.aging * ready_at - rank, next(self._seq), item, claim))

    def _fits(self, claim: Claim) -> bool:
        caps = self.capacities
        in_use = self.in_use
        if any(in_use[name] + amount > caps[name] for name, amount in claim.amounts.items()):
            return False
        if any(w in self.writers or self.readers.get(w, 0) for w in claim.writes):
            return False
        return not any(r in self.writers for r in claim.reads)

    def _take(self, claim: Claim) -> None:
        for name, amount in claim.amounts.items():
            self.in_use[name] += amount
        for r in claim.reads:
            self.readers[r] = self.readers.get(r, 0) + 1
        self.writers.update(claim.writes)

    def admit(self, alive: Callable[[T], bool] | None = None) -> list[tuple[T, Claim | None]]:
        """Pop every item that may start now, marking its claims in use; ``alive`` drops stale items."""
        heap = self._heap
        admitted: list[tuple[T, Claim | None]] = []
        if not heap:
            return admitted
        limit = self.concurrency
        blocked: list[tuple[float, int, T, Claim | None]] = []
        reserved: set[str] = set()
        scanned = 0
        while heap and (limit is None or self.running < limit) and scanned < self.scan_limit:
            entry = heapq.heappop(heap)
            item, claims = entry[2], entry[3]
            if alive is not None and not alive(item):
                continue
            if claims is None:
                admitted.append((item, None))
                self.running += 1
                continue
            scanned += 1
            names = claims.names()
            if not reserved.isdisjoint(names) or not self._fits(claims):
                blocked.append(entry)
                reserved.update(names)
                continue
            self._take(claims)
            admitted.append((item, claims))
            self.running += 1
        for entry in blocked:
            heapq.heappush(heap, entry)
        return admitted

    def release(self, claim: Claim | None) -> bool:
        """Give back a slot and the claims of an item that finished; return whether items wait (:attr:`has_waiting`)."""
        self.running -= 1
        if claim is not None:
            for name, amount in claim.amounts.items():
                self.in_use[name] -= amount
            for r in claim.reads:
                self.readers[r] -= 1
            self.writers.difference_update(claim.writes)
        return bool(self._heap)

    def discard(self, keep: Callable[[T], bool]) -> int:
        """Drop queued items for which ``keep`` is false; return how many were dropped."""
        before = len(self._heap)
        self._heap = [e for e in self._heap if keep(e[2])]
        heapq.heapify(self._heap)
        return before - len(self._heap)
