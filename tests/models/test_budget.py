"""Budget: reservations made before calls keep spent + reserved within the limit; settled totals are exact."""

from __future__ import annotations

import asyncio
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from planweave import run_virtual
from planweave.core.errors import PlanweaveError
from planweave.models.budget import Budget, Reservation
from planweave.models.errors import BudgetExceeded

NANO = 1_000_000_000
usd_amounts = st.integers(min_value=0, max_value=5 * NANO).map(lambda n: n / NANO)  # nano-dollar precision


def test_a_reservation_that_does_not_fit_raises_budget_exceeded() -> None:
    budget = Budget(usd=1.0, tokens=1000)
    held = budget.reserve(0.6, 100)
    with pytest.raises(BudgetExceeded, match=r"\$0\.5 does not fit: \$0 spent and \$0\.6 reserved of \$1"):
        budget.reserve(0.5, 100)
    with pytest.raises(BudgetExceeded, match="2000 tokens do not fit"):
        budget.reserve(0.1, 2000)
    assert issubclass(BudgetExceeded, PlanweaveError)
    budget.settle(held, 0.2, 50)
    budget.reserve(0.5, 100)  # the unused part of the settled reservation came back
    assert budget.spent_usd == 0.2 and budget.spent_tokens == 50
    assert budget.remaining_usd == pytest.approx(0.3) and budget.remaining_tokens == 850


def test_release_returns_the_whole_reservation_and_is_idempotent() -> None:
    budget = Budget(tokens=100)
    held = budget.reserve(0.0, 100)
    budget.release(held)
    budget.release(held)
    assert budget.reserved_tokens == 0 and budget.spent_tokens == 0 and budget.open_reservations == 0
    with pytest.raises(ValueError, match="not open"):
        budget.settle(held, 0.0, 1)


def test_settle_charges_the_actual_usage_even_beyond_the_reservation() -> None:
    budget = Budget(usd=1.0)
    held = budget.reserve(0.1, 10)
    budget.settle(held, 0.3, 30)
    assert budget.spent_usd == 0.3 and budget.spent_tokens == 30
    with pytest.raises(ValueError, match="not open"):
        budget.settle(held, 0.1, 1)


def test_unlimited_budget_only_counts() -> None:
    budget = Budget()
    for _ in range(3):
        budget.settle(budget.reserve(1e6, 10**9), 0.1, 7)
    assert budget.remaining_usd is None and budget.remaining_tokens is None
    assert budget.spent_tokens == 21
    assert budget.spent_usd == pytest.approx(0.3)


def test_a_reservation_from_another_budget_is_refused() -> None:
    a, b = Budget(), Budget()
    held = a.reserve(0.1, 1)
    with pytest.raises(ValueError):
        b.settle(held, 0.1, 1)


def test_negative_limits_and_estimates_are_refused() -> None:
    with pytest.raises(ValueError):
        Budget(usd=-1)
    with pytest.raises(ValueError):
        Budget(tokens=-1)
    with pytest.raises(ValueError):
        Budget().reserve(-0.1, 0)


class BudgetMachine(RuleBasedStateMachine):
    """Any interleaving of reserves, settles (within the reservation) and releases keeps the books exact."""

    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.budget = Budget(usd=2.0, tokens=5000)
        self.settled_nanos = 0
        self.settled_tokens = 0
        self.open: dict[int, Reservation] = {}

    @rule(target=reservations, usd=usd_amounts, tokens=st.integers(0, 3000))
    def reserve(self, usd: float, tokens: int) -> Reservation | None:
        free_nanos = 2 * NANO - self.settled_nanos - sum(r.usd_nanos for r in self.open.values())
        free_tokens = 5000 - self.settled_tokens - sum(r.tokens for r in self.open.values())
        fits = round(usd * NANO) <= free_nanos and tokens <= free_tokens
        try:
            held = self.budget.reserve(usd, tokens)
        except BudgetExceeded:
            assert not fits
            return None
        assert fits
        self.open[held.id] = held
        return held

    @rule(held=consumes(reservations), usd_fraction=st.fractions(0, 1), token_fraction=st.fractions(0, 1))
    def settle(self, held: Reservation | None, usd_fraction: Fraction, token_fraction: Fraction) -> None:
        if held is None:
            return
        actual_usd = (held.usd_nanos * usd_fraction // 1) / NANO
        actual_tokens = int(held.tokens * token_fraction)
        self.budget.settle(held, actual_usd, actual_tokens)
        del self.open[held.id]
        self.settled_nanos += round(actual_usd * NANO)
        self.settled_tokens += actual_tokens

    @rule(held=consumes(reservations))
    def release(self, held: Reservation | None) -> None:
        if held is None:
            return
        self.budget.release(held)
        del self.open[held.id]

    @invariant()
    def spent_plus_reserved_never_exceeds_the_limit(self) -> None:
        b = self.budget
        assert b.remaining_usd is not None and b.remaining_usd >= 0
        assert b.remaining_tokens is not None and b.remaining_tokens >= 0

    @invariant()
    def settled_totals_are_exact(self) -> None:
        assert self.budget.spent_usd == self.settled_nanos / NANO
        assert self.budget.spent_tokens == self.settled_tokens
        assert self.budget.reserved_tokens == sum(r.tokens for r in self.open.values())
        assert self.budget.open_reservations == len(self.open)


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(usd_amounts, st.integers(0, 2000), st.floats(0, 1), st.integers(0, 5)), min_size=1, max_size=40,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_concurrent_calls_never_overshoot_and_totals_are_exact(
    calls: list[tuple[float, int, float, int]], seed: int
) -> None:
    """Many asyncio tasks reserve, yield to each other a random number of times, then settle or fail."""
    budget = Budget(usd=3.0, tokens=6000)
    rng = random.Random(seed)
    charged: list[tuple[int, int]] = []

    def check() -> None:
        assert budget.remaining_usd is not None and budget.remaining_usd >= 0
        assert budget.remaining_tokens is not None and budget.remaining_tokens >= 0

    async def call(usd: float, tokens: int, fraction: float, yields: int) -> None:
        try:
            held = budget.reserve(usd, tokens)
        except BudgetExceeded:
            return
        check()
        for _ in range(yields):
            await asyncio.sleep(0)
            check()
        if rng.random() < 0.2:
            budget.release(held)  # the call failed before costing anything
        else:
            actual_usd, actual_tokens = held.usd * fraction, int(tokens * fraction)
            budget.settle(held, actual_usd, actual_tokens)
            charged.append((round(actual_usd * NANO), actual_tokens))
        check()

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            for args in calls:
                tg.create_task(call(*args))

    asyncio.run(main())
    assert budget.open_reservations == 0
    assert budget.reserved_usd == 0 and budget.reserved_tokens == 0
    assert budget.spent_usd == sum(n for n, _ in charged) / NANO
    assert budget.spent_tokens == sum(t for _, t in charged)


# -- acquire: waiting for room, then what remains down to a floor ------------------------------------------------
def test_a_call_that_does_not_fit_beside_an_open_reservation_waits_for_it_to_settle() -> None:
    budget = Budget(tokens=2000)
    planner = budget.reserve(0.0, 1900)  # a streaming planner's worst case
    got: list[tuple[float, int]] = []

    async def planner_finishes() -> None:
        await asyncio.sleep(5)
        budget.settle(planner, 0.0, 400)

    async def step() -> None:
        reservation = await budget.acquire(0.0, 300)
        got.append((asyncio.get_running_loop().time(), reservation.tokens))

    async def main() -> None:
        async with asyncio.timeout(60):  # virtual: a missed wake-up fails here, not at the pytest timeout
            await asyncio.gather(planner_finishes(), step())

    run_virtual(main())
    assert got == [(5.0, 300)]  # in as soon as the planner settled, with its whole worst case
    assert budget.reserved_tokens == 300 and budget.spent_tokens == 400


def test_a_release_and_a_settle_in_a_worker_thread_wake_waiting_calls_too() -> None:
    budget = Budget(tokens=100)
    first, second = budget.reserve(0.0, 60), budget.reserve(0.0, 40)

    async def main() -> list[int]:
        async with asyncio.timeout(60):
            waiting = asyncio.ensure_future(budget.acquire(0.0, 90))
            await asyncio.sleep(1)
            budget.release(first)  # 60 free: 90 still does not fit, and 'second' is open, so it keeps waiting
            await asyncio.sleep(1)
            assert not waiting.done()
            await asyncio.to_thread(budget.settle, second, 0.0, 5)
            return [(await waiting).tokens, budget.open_reservations]

    assert run_virtual(main()) == [90, 1]


def test_with_nothing_in_flight_a_call_gets_what_remains_down_to_its_floor() -> None:
    budget = Budget(tokens=1000)
    budget.settle(budget.reserve(0.0, 700), 0.0, 700)

    async def main() -> tuple[int, str]:
        lowered = await budget.acquire(0.0, 500, floor_tokens=200)  # 300 remain: the call lowers max_tokens
        budget.settle(lowered, 0.0, 250)
        with pytest.raises(BudgetExceeded) as refused:  # 50 remain, below the floor of 200
            await budget.acquire(0.0, 500, floor_tokens=200)
        return lowered.tokens, str(refused.value)

    tokens, message = run_virtual(main())
    assert tokens == 300
    assert message == ("budget exceeded: 500 tokens do not fit: 950 spent and 0 reserved of 1000 "
                       "(below the floor of 200)")
    assert budget.spent_tokens == 950 and budget.open_reservations == 0


def test_without_a_floor_or_with_dollars_short_acquire_refuses_once_nothing_is_in_flight() -> None:
    async def main() -> list[str]:
        messages = []
        for budget, floor in ((Budget(tokens=100), None), (Budget(usd=0.01, tokens=1000), 10)):
            with pytest.raises(BudgetExceeded) as refused:
                await budget.acquire(0.02 if budget.usd_limit else 0.0, 500, floor_tokens=floor)
            messages.append(str(refused.value))
            assert budget.open_reservations == 0
        return messages

    no_floor, no_dollars = run_virtual(main())
    assert no_floor == "budget exceeded: 500 tokens do not fit: 0 spent and 0 reserved of 100"
    assert no_dollars == "budget exceeded: $0.02 does not fit: $0 spent and $0 reserved of $0.01"


def test_a_cancelled_wait_holds_nothing() -> None:
    budget = Budget(tokens=100)
    held = budget.reserve(0.0, 80)

    async def main() -> None:
        waiting = asyncio.ensure_future(budget.acquire(0.0, 50))
        await asyncio.sleep(1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        budget.release(held)

    run_virtual(main())
    assert budget.open_reservations == 0 and budget.reserved_tokens == 0
