"""A model cascade: the cheapest tier first, a stronger one when a monitor fires, back down after a streak.

One :class:`Cascade` is shared by the steps of a run that name the same *cascade key* (by default the tool and its
tier list): its tier index over tiers ordered cheap to strong is where a new step starts. A fire escalates the step
that fired one tier above the tier it ran on (its retries run there or higher, a *floor* for that step), and
raises the shared index to it; ``streak`` successes in a row, with no fire or failure between them, lower the shared
index one tier. Pure: no clock, no I/O; the adapter (``allocate/cascade_seam.py``) journals the :class:`Shift` it
returns as an ``escalation`` event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planweave.allocate.monitors import Fire, MonitorName

Rung = Literal["escalate", "deescalate"]


@dataclass(frozen=True, slots=True)
class Shift:
    """The cascade moved: ``rung`` up or down, from one tier to another, because ``monitor`` fired (``reason``) or
    (de-escalating, ``monitor`` None) after a streak of successes."""

    rung: Rung
    from_tier: str
    to_tier: str
    reason: str
    monitor: MonitorName | None = None


class Cascade:
    """Tiers ``tiers`` (cheap to strong) shared by the steps of one cascade key; see the module docstring.

    Invariants (tests/allocate/test_monitors.py): every index is within the tiers; the index and a step's floor
    rise only on a fire; the index falls by one only after ``streak`` successes in a row.
    """

    def __init__(self, tiers: Sequence[str], *, streak: int = 3) -> None:
        if not tiers:
            raise ValueError("a cascade needs at least one tier")
        if len(set(tiers)) != len(tiers):
            raise ValueError(f"a cascade's tiers must be distinct, got {list(tiers)}")
        if streak < 1:
            raise ValueError(f"a cascade's streak must be at least 1, got {streak}")
        self.tiers = tuple(tiers)
        self.streak = streak
        self.index = 0
        self.successes = 0  # in a row since the last fire, failure or shift
        self._floors: dict[str, int] = {}  # a step that fired: its retries run at least here

    @property
    def tier(self) -> str:
        """Where a new step starts."""
        return self.tiers[self.index]

    def index_for(self, step: str) -> int:
        """The tier index ``step``'s next attempt runs at: the shared index, or the step's own floor if higher."""
        return max(self.index, self._floors.get(step, 0))

    def tier_for(self, step: str) -> str:
        return self.tiers[self.index_for(step)]

    def fired(self, step: str, fire: Fire, *, ran_at: int | None = None) -> Shift | None:
        """``fire`` on ``step``, whose attempt ran at tier index ``ran_at`` (default: where it would run now):
        escalate it one tier above; None when it ran at the strongest tier already (nothing to escalate to)."""
        self.successes = 0
        base = self.index_for(step) if ran_at is None else max(0, min(ran_at, len(self.tiers) - 1))
        if base + 1 >= len(self.tiers):
            return None
        up = base + 1
        self._floors[step] = max(self._floors.get(step, 0), up)
        self.index = max(self.index, up)
        return Shift("escalate", self.tiers[base], self.tiers[up], fire.reason, fire.monitor)

    def failed(self, step: str) -> None:
        """An attempt of ``step`` failed with no monitor firing: the streak is broken."""
        self.successes = 0

    def succeeded(self, step: str) -> Shift | None:
        """An attempt of ``step`` succeeded: its floor is done with; after ``streak`` successes in a row the
        shared index falls one tier."""
        self._floors.pop(step, None)
        self.successes += 1
        if self.successes < self.streak or self.index == 0:
            return None
        self.successes = 0
        down = self.index - 1
        shift = Shift("deescalate", self.tiers[self.index], self.tiers[down],
                      f"{self.streak} successes in a row on {self.tiers[self.index]}")
        self.index = down
        return shift

    def restore(self, moves: Iterable[Mapping[str, Any]], done: Iterable[str] = ()) -> None:
        """Replay journaled moves of this cascade (``escalation`` events' data with ``step``, ``rung``, ``to_tier``,
        in order) so a resumed run goes on where it was: the shared index where the last move left it, the floors
        of steps that escalated and did not succeed since (``done``: steps that did). The streak of successes is
        not journaled and starts again at zero. Moves to tiers this cascade does not have are ignored."""
        for move in moves:
            to = move.get("to_tier")
            if to not in self.tiers:
                continue
            at = self.tiers.index(to)
            if move.get("rung") == "escalate":
                step = move.get("step")
                if isinstance(step, str):
                    self._floors[step] = max(self._floors.get(step, 0), at)
                self.index = max(self.index, at)
            elif move.get("rung") == "deescalate":
                self.index = at
        for step in done:
            self._floors.pop(step, None)
        self.successes = 0
