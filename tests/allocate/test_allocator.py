"""The allocator: known best answers under loose and tight budgets and deadlines, budget safety, exact estimates."""

from __future__ import annotations

import pytest

from planweave.allocate import (
    POLICIES,
    AllocationError,
    Allocator,
    Choice,
    Problem,
    StepOptions,
    TierProfile,
    TierTable,
)

TIERS = TierTable({
    "small": TierProfile("small", "m-small", p_success=0.6, duration_s=1.0, cost_usd=0.001),
    "large": TierProfile("large", "m-large", p_success=1.0, duration_s=1.5, cost_usd=0.010),
})
BOTH = ("small", "large")


def chain(n: int, *, attempts: int = 3, samples: tuple[int, ...] = (1,), select: str = "first_valid"
          ) -> tuple[StepOptions, ...]:
    return tuple(StepOptions(f"s{i}", deps=(f"s{i - 1}",) if i else (), tiers=BOTH, samples=samples,
                             select=select, attempts=attempts) for i in range(n))  # type: ignore[arg-type]


def test_loose_budget_and_deadline_take_the_cheap_tier_when_it_is_as_likely() -> None:
    # small at p=1.0 is as certain as large and ten times cheaper: a tie on P(all), broken by cost
    sure = TierTable({**TIERS.tiers, "small": TierProfile("small", "m-small", 1.0, 1.0, 0.001)})
    decision = Allocator(sure, sims=100).decide(Problem(chain(3), budget_usd=1.0, deadline_s=100.0), "s0")
    assert decision.choice == Choice("small", 1)
    assert decision.estimate.p_all == 1.0
    assert all(c == Choice("small", 1) for c in decision.plan.values())


def test_loose_deadline_lets_retries_of_the_cheap_tier_do_what_a_tight_one_needs_the_strong_tier_for() -> None:
    # s0 alone, budget loose. Deadline 100 s: small with 6 attempts fails 0.4**6 = 0.4% of runs, but 3 samples of small
    # in parallel fail 0.4**18: both beat nothing, and small x3 costs less than large. Deadline 1.6 s: only a first
    # attempt fits, small (even x3: 1 - 0.4**3 = 94%) loses to large (certain, 1.5 s).
    step = (StepOptions("s0", tiers=BOTH, samples=(1, 2, 3), attempts=6),)
    allocator = Allocator(TIERS, sims=400)
    loose = allocator.decide(Problem(step, budget_usd=1.0, deadline_s=100.0), "s0")
    tight = allocator.decide(Problem(step, budget_usd=1.0, deadline_s=1.6), "s0")
    assert loose.choice.tier == "small" and loose.estimate.p_all == 1.0
    assert tight.choice == Choice("large", 1) and tight.estimate.p_all == 1.0
    small_x3 = next(c for c in tight.compared if c.choice == Choice("small", 3))
    assert 0.88 < small_x3.estimate.p_all < 0.99  # 1 - 0.4**3 = 0.936, within sampling error


def test_a_tight_budget_takes_the_cheap_tier_even_when_the_strong_one_is_surer() -> None:
    # three steps; large for all costs $0.03 > budget $0.02, so at most one large step fits in the simulated total
    allocator = Allocator(TIERS, sims=300)
    decision = allocator.decide(Problem(chain(3, attempts=4), budget_usd=0.015, deadline_s=100.0), "s0")
    assert sum(c.tier == "large" for c in decision.plan.values()) <= 1
    assert decision.estimate.p_budget == 1.0
    strongest = allocator.decide(Problem(chain(3, attempts=4), budget_usd=0.015, deadline_s=100.0), "s0",
                                 policy="strongest")
    assert strongest.estimate.p_budget == 0.0  # all large: $0.03 never fits
    assert decision.estimate.p_all > strongest.estimate.p_all


def test_never_chooses_a_candidate_whose_reserved_worst_case_does_not_fit() -> None:
    step = (StepOptions("s0", tiers=BOTH, samples=(1, 2, 3), attempts=1),)
    problem = Problem(step, budget_usd=1.0, deadline_s=1.6)  # only large is certain here
    allocator = Allocator(TIERS, sims=200)
    assert allocator.decide(problem, "s0").choice == Choice("large", 1)

    def fits(choice: Choice) -> bool:
        return choice.tier == "small" and choice.samples <= 2

    for policy in POLICIES:
        decision = allocator.decide(problem, "s0", fits=fits, policy=policy)
        assert fits(decision.choice), (policy, decision.choice)
    decision = allocator.decide(problem, "s0", fits=fits)
    assert decision.choice == Choice("small", 2)  # the surest of those that fit
    assert {c.choice: c.fits for c in decision.compared}[Choice("large", 1)] is False


def test_when_nothing_fits_the_cheapest_is_tried_and_the_reason_says_so() -> None:
    decision = Allocator(TIERS, sims=50).decide(Problem(chain(1)), "s0", fits=lambda c: False)
    assert decision.choice == Choice("small", 1)
    assert "no candidate" in decision.reason


def test_fixed_durations_give_exact_deadline_probabilities_on_a_diamond() -> None:
    sure = TierTable({"t": TierProfile("t", "m", 1.0, 2.0, 0.0)})
    steps = (
        StepOptions("a", tiers=("t",)),
        StepOptions("b", deps=("a",), fixed_s=5.0),
        StepOptions("c", deps=("a",), tiers=("t",)),
        StepOptions("d", deps=("b", "c"), tiers=("t",)),
    )
    allocator = Allocator(sure, sims=20)
    at = allocator.decide(Problem(steps, deadline_s=9.0), "a")  # a 2 + b 5 + d 2 = 9: the critical path
    assert at.estimate.p_deadline == 1.0 and at.estimate.makespan_s == pytest.approx(9.0)
    short = allocator.decide(Problem(steps, deadline_s=8.999), "a")
    assert short.estimate.p_deadline == 0.0


def test_a_running_step_keeps_its_choice_and_only_what_is_left_of_it_counts() -> None:
    steps = (
        StepOptions("a", tiers=BOTH, chosen=Choice("large", 1), elapsed_s=1.0),
        StepOptions("b", deps=("a",), tiers=BOTH, attempts=1),
    )
    decision = Allocator(TIERS, sims=200).decide(Problem(steps, deadline_s=2.1), "b")
    assert "a" not in decision.plan
    assert decision.choice == Choice("large", 1)  # 0.5 s of a left + 1.5 s: only large is certain
    assert decision.estimate.p_deadline == 1.0


def test_the_same_seed_gives_the_same_decision_and_candidates_share_their_luck() -> None:
    problem = Problem(chain(4, samples=(1, 2)), budget_usd=0.03, deadline_s=6.0)
    one = Allocator(TIERS, sims=100, seed=7).decide(problem, "s0")
    two = Allocator(TIERS, sims=100, seed=7).decide(problem, "s0")
    assert one.choice == two.choice and one.estimate == two.estimate
    assert [c.estimate for c in one.compared] == [c.estimate for c in two.compared]


def test_unknown_tiers_and_steps_are_errors_naming_them() -> None:
    with pytest.raises(AllocationError, match="unknown tier 'huge'"):
        Allocator(TIERS).decide(Problem((StepOptions("s0", tiers=("huge",)),)), "s0")
    with pytest.raises(AllocationError, match="step 'nope'"):
        Allocator(TIERS).decide(Problem(chain(1)), "nope")


def test_a_tier_table_from_a_document_names_the_tier_and_field_it_refuses() -> None:
    table = TierTable.from_mapping({"s": {"model": "m", "p_success": 0.5, "duration_s": 1, "cost_usd": 0.1}})
    assert table["s"].p_success == 0.5 and table.by_model("m") is table["s"]
    for doc, message in (
        ({"s": {"model": "m", "p_success": 1.5, "duration_s": 1, "cost_usd": 0}}, "tier 's': p_success"),
        ({"s": {"model": "m", "duration_s": 1, "cost_usd": 0}}, "tier 's': missing field 'p_success'"),
        ({"s": {"model": "m", "p_success": 1, "duration_s": "x", "cost_usd": 0}}, "field 'duration_s'"),
        ({"s": {"model": "m", "p_success": 1, "duration_s": 1, "cost_usd": 0, "speed": 2}}, "unknown field 'speed'"),
        ([], "expected a mapping"),
    ):
        with pytest.raises(AllocationError, match=message):
            TierTable.from_mapping(doc, where="tiers.yaml")


def test_candidates_are_compared_on_common_random_numbers() -> None:
    # two tiers that behave alike and differ only in price: on the same draws their estimates are identical
    twins = TierTable({"a": TierProfile("a", "m-a", 0.5, 1.0, 0.001, duration_sigma=0.5),
                       "b": TierProfile("b", "m-b", 0.5, 1.0, 0.002, duration_sigma=0.5)})
    steps = (StepOptions("s0", tiers=("a", "b"), attempts=2),)
    decision = Allocator(twins, sims=200).decide(Problem(steps, deadline_s=2.0), "s0")
    by = {c.choice.tier: c.estimate for c in decision.compared}
    assert 0.0 < by["a"].p_all < 1.0
    assert by["a"].p_all == by["b"].p_all and by["a"].makespan_s == by["b"].makespan_s
    assert decision.choice.tier == "a"


def test_a_vote_needs_more_than_half_of_the_samples() -> None:
    # p = 0.6 per sample: a vote of 2 needs both (0.36), of 3 needs two (0.648); first_valid of 2 needs one (0.84)
    one = TierTable({"t": TierProfile("t", "m", 0.6, 1.0, 0.0)})
    allocator = Allocator(one, sims=2000)

    def p(select: str, k: int) -> float:
        step = (StepOptions("s", tiers=("t",), samples=(k,), select=select),)  # type: ignore[arg-type]
        return allocator.decide(Problem(step), "s").estimate.p_success

    assert p("vote", 2) == pytest.approx(0.36, abs=0.04)
    assert p("vote", 3) == pytest.approx(0.648, abs=0.04)
    assert p("first_valid", 2) == pytest.approx(0.84, abs=0.04)
