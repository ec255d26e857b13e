"""A spending limit in US dollars and tokens that concurrent model calls cannot overshoot.

A call reserves its worst case (prompt estimate plus ``max_tokens``) *before* it starts; a reservation that does not
fit raises :class:`BudgetExceeded`. When the call ends it settles with the actual usage, which frees the rest of the
reservation; a call that fails before costing anything releases it. So at any moment ``spent + reserved <= limit``
as long as the actual usage stays within the reservation, however many calls run at once.

Pure bookkeeping: no I/O, no asyncio. The lock only makes it safe for tools that run in worker threads. Dollars are
counted in integer nano-dollars, so totals are exact whatever the order of settlement.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from planweave.models.errors import BudgetExceeded

_NANO = 1_000_000_000


def _nanos(usd: float) -> int:
    return round(usd * _NANO)


def _usd(nanos: int) -> float:
    return nanos / _NANO


@dataclass(frozen=True, slots=True)
class Reservation:
    """A slice of a budget held for one call; pass it to :meth:`Budget.settle` or :meth:`Budget.release`."""

    id: int
    usd_nanos: int
    tokens: int

    @property
    def usd(self) -> float:
        return _usd(self.usd_nanos)


class Budget:
    """A hard limit on dollars, tokens or both (None means unlimited); see the module docstring for the protocol."""

    def __init__(self, usd: float | None = None, tokens: int | None = None) -> None:
        if usd is not None and usd < 0:
            raise ValueError(f"budget usd must be >= 0, got {usd}")
        if tokens is not None and tokens < 0:
            raise ValueError(f"budget tokens must be >= 0, got {tokens}")
        self.usd_limit = usd
        self.token_limit = tokens
        self._usd_limit_nanos = None if usd is None else _nanos(usd)
        self._spent_nanos = 0
        self._spent_tokens = 0
        self._reserved_nanos = 0
        self._reserved_tokens = 0
        self._open: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- reading -------------------------------------------------------------------------------------------------
    @property
    def spent_usd(self) -> float:
        return _usd(self._spent_nanos)

    @property
    def spent_tokens(self) -> int:
        return self._spent_tokens

    @property
    def reserved_usd(self) -> float:
        return _usd(self._reserved_nanos)

    @property
    def reserved_tokens(self) -> int:
        return self._reserved_tokens

    @property
    def open_reservations(self) -> int:
        return len(self._open)

    @property
    def remaining_usd(self) -> float | None:
        """Dollars neither spent nor reserved (None if unlimited; negative if a call overran its reservation)."""
        if self._usd_limit_nanos is None:
            return None
        return _usd(self._usd_limit_nanos - self._spent_nanos - self._reserved_nanos)

    @property
    def remaining_tokens(self) -> int | None:
        """Tokens neither spent nor reserved (None if unlimited; negative if a call overran its reservation)."""
        if self.token_limit is None:
            return None
        return self.token_limit - self._spent_tokens - self._reserved_tokens

    # -- the protocol ---------------------------------------------------------------------------------------------
    def reserve(self, estimate_usd: float, estimate_tokens: int) -> Reservation:
        """Hold the estimates for a call about to start; raise BudgetExceeded if they do not fit in what is left."""
        if estimate_usd < 0 or estimate_tokens < 0:
            raise ValueError(f"estimates must be >= 0, got ${estimate_usd} and {estimate_tokens} tokens")
        nanos = _nanos(estimate_usd)
        with self._lock:
            short = []
            if self._usd_limit_nanos is not None and (
                self._spent_nanos + self._reserved_nanos + nanos > self._usd_limit_nanos
            ):
                short.append(
                    f"${estimate_usd:.6g} does not fit: ${self.spent_usd:.6g} spent and ${self.reserved_usd:.6g} "
                    f"reserved of ${self.usd_limit:.6g}"
                )
            if self.token_limit is not None and (
                self._spent_tokens + self._reserved_tokens + estimate_tokens > self.token_limit
            ):
                short.append(
                    f"{estimate_tokens} tokens do not fit: {self._spent_tokens} spent and {self._reserved_tokens} "
                    f"reserved of {self.token_limit}"
                )
            if short:
                raise BudgetExceeded("budget exceeded: " + "; ".join(short))
            reservation = Reservation(next(self._ids), nanos, estimate_tokens)
            self._open[reservation.id] = reservation
            self._reserved_nanos += nanos
            self._reserved_tokens += estimate_tokens
            return reservation

    def settle(self, reservation: Reservation, actual_usd: float, actual_tokens: int) -> None:
        """Charge a finished call's actual usage and free its reservation; the actual amount is charged even if larger.

        Raises ValueError if the reservation is not open (already settled or released, or from another budget).
        """
        if actual_usd < 0 or actual_tokens < 0:
            raise ValueError(f"actual usage must be >= 0, got ${actual_usd} and {actual_tokens} tokens")
        with self._lock:
            if self._open.pop(reservation.id, None) is not reservation:
                raise ValueError(f"reservation {reservation.id} is not open in this budget")
            self._reserved_nanos -= reservation.usd_nanos
            self._reserved_tokens -= reservation.tokens
            self._spent_nanos += _nanos(actual_usd)
            self._spent_tokens += actual_tokens

    def release(self, reservation: Reservation) -> None:
        """Free a reservation without charging anything; releasing one that is no longer open does nothing."""
        with self._lock:
            if self._open.get(reservation.id) is not reservation:
                return
            del self._open[reservation.id]
            self._reserved_nanos -= reservation.usd_nanos
            self._reserved_tokens -= reservation.tokens

    def __repr__(self) -> str:
        return (
            f"Budget(usd={self.usd_limit}, tokens={self.token_limit}, spent_usd={self.spent_usd:.6g}, "
            f"spent_tokens={self._spent_tokens}, reserved_usd={self.reserved_usd:.6g}, "
            f"reserved_tokens={self._reserved_tokens})"
        )
