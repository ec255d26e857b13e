"""A spending limit in US dollars and tokens that concurrent model calls cannot overshoot.

A call reserves its worst case (prompt estimate plus ``max_tokens``) *before* it starts; a reservation that does not
fit raises :class:`BudgetExceeded`. When the call ends it settles with the actual usage, which frees the rest of the
reservation; a call that fails before costing anything releases it. So at any moment ``spent + reserved <= limit``
as long as the actual usage stays within the reservation, however many calls run at once.

:meth:`Budget.acquire` is the waiting form of ``reserve`` for calls that share a budget (a streaming planner beside
``llm`` steps): a worst case that does not fit while other reservations are open waits until one of them settles or
is released, instead of failing while room is about to come back; once nothing is in flight, a call that still does
not fit gets what remains, down to the floor it declares (it lowers its ``max_tokens`` to the reservation's
``tokens``), and only below that floor is it refused.

A reservation shrinks to the actual usage the moment its call ends, also when it fails or is cancelled: a streamed
call that was cut is charged what it had cost by then, read by a :class:`StreamMeter` from its chunks (the server's
counts where they came, else an estimate marked ``estimated``), so the spend a run reports never understates what
the provider bills.

A budget lives in one process; its callers journal each reservation (``model_reserved``, durable before the
request goes out) and settle it by id in the call's ``model_call``, so a resume after a kill rebuilds the budget
with a call left unsettled counted at its worst case (:class:`~planweave.limits.JournaledLimits`).

Bookkeeping with no I/O: ``reserve``, ``settle`` and ``release`` never wait; the lock makes them safe for tools that
run in worker threads, and a settle in a thread wakes the calls waiting in ``acquire`` through their loop. Dollars
are counted in integer nano-dollars, so totals are exact whatever the order of settlement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from planweave.models.base import Chunk, CompletionRequest, Delta, Usage
from planweave.models.errors import BudgetExceeded
from planweave.models.pricing import CHARS_PER_TOKEN

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
        self._wakers: list[Callable[[], None]] = []  # calls waiting in acquire() for a reservation to end

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
        with self._lock:
            short = self._shortfall(_nanos(estimate_usd), estimate_tokens)
            if short:
                raise BudgetExceeded("budget exceeded: " + "; ".join(short))
            return self._hold(_nanos(estimate_usd), estimate_tokens)

    async def acquire(self, estimate_usd: float, estimate_tokens: int, *, floor_tokens: int | None = None,
                      usd_per_token: float | None = None) -> Reservation:
        """Reserve the estimates as :meth:`reserve` does, waiting while they do not fit and other reservations are
        open (each settle or release re-checks). With none open, a worst case that still does not fit is granted
        what remains if that is at least ``floor_tokens`` (the returned reservation's ``tokens`` says how much: the
        call lowers its ``max_tokens`` to it); in dollars too, given ``usd_per_token`` (what one reply token costs:
        each token fewer frees that much); otherwise BudgetExceeded.

        Cancelling the waiting call leaves nothing held. Must run on an event loop; settles from other threads wake it.
        """
        if estimate_usd < 0 or estimate_tokens < 0:
            raise ValueError(f"estimates must be >= 0, got ${estimate_usd} and {estimate_tokens} tokens")
        if floor_tokens is not None and not 0 <= floor_tokens <= estimate_tokens:
            raise ValueError(f"floor_tokens must be between 0 and the estimate {estimate_tokens}, got {floor_tokens}")
        nanos = _nanos(estimate_usd)
        loop = asyncio.get_running_loop()
        while True:
            woken: asyncio.Future[None] = loop.create_future()

            def wake(_woken: asyncio.Future[None] = woken) -> None:
                loop.call_soon_threadsafe(lambda: None if _woken.done() else _woken.set_result(None))

            with self._lock:  # checking and registering at once: a settle in between cannot be missed
                short = self._shortfall(nanos, estimate_tokens)
                if not short:
                    return self._hold(nanos, estimate_tokens)
                if not self._open:
                    return self._lowered(nanos, estimate_tokens, floor_tokens, short, usd_per_token)
                self._wakers.append(wake)
            try:
                await woken
            finally:
                with self._lock:
                    if wake in self._wakers:
                        self._wakers.remove(wake)

    def _shortfall(self, nanos: int, tokens: int) -> list[str]:
        """Why ``nanos`` and ``tokens`` do not fit now (empty if they do); call with the lock held."""
        short = []
        if self._usd_limit_nanos is not None and (
            self._spent_nanos + self._reserved_nanos + nanos > self._usd_limit_nanos
        ):
            short.append(
                f"${_usd(nanos):.6g} does not fit: ${self.spent_usd:.6g} spent and ${self.reserved_usd:.6g} "
                f"reserved of ${self.usd_limit:.6g}"
            )
        if self.token_limit is not None and self._spent_tokens + self._reserved_tokens + tokens > self.token_limit:
            short.append(
                f"{tokens} tokens do not fit: {self._spent_tokens} spent and {self._reserved_tokens} "
                f"reserved of {self.token_limit}"
            )
        return short

    def _hold(self, nanos: int, tokens: int) -> Reservation:
        reservation = Reservation(next(self._ids), nanos, tokens)
        self._open[reservation.id] = reservation
        self._reserved_nanos += nanos
        self._reserved_tokens += tokens
        return reservation

    def _lowered(self, nanos: int, tokens: int, floor: int | None, short: list[str],
                 usd_per_token: float | None) -> Reservation:
        """With nothing in flight: the tokens and dollars that remain, lowered together (each token fewer costs
        ``usd_per_token`` less), if that reaches ``floor``; else BudgetExceeded naming the floor."""
        grant = tokens
        if self.token_limit is not None:
            grant = min(grant, self.token_limit - self._spent_tokens - self._reserved_tokens)
        per = None if usd_per_token is None else usd_per_token * _NANO  # nano-dollars a token (may be fractional)
        if self._usd_limit_nanos is not None and self._shortfall(nanos, 0):
            room = self._usd_limit_nanos - self._spent_nanos - self._reserved_nanos
            grant = min(grant, tokens - math.ceil((nanos - room) / per)) if per else -1
        if floor is None or grant < max(floor, 1):
            below = f" (below the floor of {floor})" if floor is not None and grant >= 0 else ""
            raise BudgetExceeded("budget exceeded: " + "; ".join(short) + below)
        granted = nanos if not per else min(nanos, math.ceil(nanos - (tokens - grant) * per))
        return self._hold(granted, grant)

    def _wake_all(self) -> None:
        """Tell the calls waiting in acquire() that a reservation ended; call with the lock held."""
        for wake in self._wakers:
            wake()
        self._wakers.clear()

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
            self._wake_all()

    def release(self, reservation: Reservation) -> None:
        """Free a reservation without charging anything; releasing one that is no longer open does nothing."""
        with self._lock:
            if self._open.get(reservation.id) is not reservation:
                return
            del self._open[reservation.id]
            self._reserved_nanos -= reservation.usd_nanos
            self._reserved_tokens -= reservation.tokens
            self._wake_all()

    def __repr__(self) -> str:
        return (
            f"Budget(usd={self.usd_limit}, tokens={self.token_limit}, spent_usd={self.spent_usd:.6g}, "
            f"spent_tokens={self._spent_tokens}, reserved_usd={self.reserved_usd:.6g}, "
            f"reserved_tokens={self._reserved_tokens})"
        )


class StreamMeter:
    """What a streamed call has cost so far, read from the chunks it yielded: to charge a stream that was cut.

    Each :class:`Delta` may carry the call's usage up to it (the OpenAI client's do); text after the last one that
    did, or all of it from a client whose deltas carry none, is estimated at :data:`CHARS_PER_TOKEN` characters a
    token, on top of ``prompt_tokens`` (the caller's estimate of the prompt).
    """

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.chars = 0  # text received
        self._usage: Usage | None = None
        self._chars_at_usage = 0

    def feed(self, chunk: Chunk) -> None:
        """Count one chunk of the stream (a Completion, the end of a whole stream, adds nothing)."""
        if isinstance(chunk, Delta):
            self.chars += len(chunk.text)
            if chunk.usage is not None:
                self._usage, self._chars_at_usage = chunk.usage, self.chars

    @property
    def received(self) -> bool:
        """Whether the stream yielded anything (a call cut before that may not have cost anything)."""
        return self.chars > 0 or self._usage is not None

    def spent(self) -> Usage:
        """The usage to charge for the stream as it stands: ``estimated`` unless it is all the server's counts."""
        tail = -(-(self.chars - self._chars_at_usage) // CHARS_PER_TOKEN)
        if self._usage is None:
            return Usage(self.prompt_tokens, tail, "estimated")
        source = self._usage.source if tail == 0 else "estimated"
        return Usage(self._usage.prompt_tokens, self._usage.completion_tokens + tail, source)


async def acquire_call(budget: Budget, request: CompletionRequest, usd: float, tokens: int, *, floor_tokens: int,
                       usd_per_token: float | None = None) -> tuple[Reservation, CompletionRequest]:
    """Acquire a call's worst case (``usd``, ``tokens``: the prompt estimate plus ``request.max_tokens``) from
    ``budget`` with :meth:`Budget.acquire`, the reply allowed down to ``floor_tokens`` (at most its ``max_tokens``;
    ``usd_per_token``: the model's price of a reply token, to lower a dollar budget's call too); return the
    reservation and the request to send, its ``max_tokens`` lowered to what was granted."""
    if request.max_tokens is None:
        raise ValueError("a budgeted call needs max_tokens (a budget cannot bound a call without it)")
    prompt = tokens - request.max_tokens
    reservation = await budget.acquire(usd, tokens, floor_tokens=prompt + min(floor_tokens, request.max_tokens),
                                       usd_per_token=usd_per_token)
    if reservation.tokens < tokens:
        request = dataclasses.replace(request, max_tokens=reservation.tokens - prompt)
    return reservation, request
