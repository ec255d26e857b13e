"""Properties of the allocator over random plans, tiers, budgets, deadlines and room: the Monte Carlo choice is the
likeliest of the candidates that fit, never one that does not, and every estimate is a probability."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planweave.allocate import POLICIES, Allocator, Choice, Problem, StepOptions, TierProfile, TierTable

profiles = st.builds(
    lambda p, d, c, s: (p, d, c, s),
    st.floats(0.05, 1.0), st.floats(0.1, 10.0), st.floats(0.0, 0.1), st.sampled_from([0.0, 0.3]),
)


@st.composite
def problems(draw: st.DrawFn) -> tuple[TierTable, Problem, frozenset[Choice]]:
    tiers = {f"t{i}": TierProfile(f"t{i}", f"m{i}", *draw(profiles)[:3], duration_sigma=draw(profiles)[3])
             for i in range(draw(st.integers(1, 3)))}
    n = draw(st.integers(1, 5))
    steps = []
    for i in range(n):
        deps = tuple(sorted({f"s{j}" for j in draw(st.lists(st.integers(0, i - 1), max_size=2))})) if i else ()
        steps.append(StepOptions(
            f"s{i}", deps=deps, tiers=tuple(tiers), samples=tuple(range(1, draw(st.integers(1, 3)) + 1)),
            select=draw(st.sampled_from(["vote", "first_valid", "verifier"])), attempts=draw(st.integers(1, 3))))
    budget = draw(st.one_of(st.none(), st.floats(0.0, 0.5)))
    deadline = draw(st.one_of(st.none(), st.floats(0.0, 40.0)))
    candidates = [Choice(t, k) for t in tiers for k in steps[0].samples]
    room = frozenset(draw(st.lists(st.sampled_from(candidates), unique=True)))
    return TierTable(tiers), Problem(tuple(steps), budget, deadline), room


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from(POLICIES))
def test_the_choice_fits_when_anything_does_and_monte_carlo_takes_the_likeliest(
        case: tuple[TierTable, Problem, frozenset[Choice]], policy: str) -> None:
    table, problem, room = case
    decision = Allocator(table, sims=40).decide(problem, "s0", fits=lambda c: c in room,
                                                policy=policy)  # type: ignore[arg-type]
    fitting = [c for c in decision.compared if c.fits]
    assert {c.choice for c in fitting} == room
    if room:
        assert decision.choice in room
    else:
        assert decision.reason
    for c in decision.compared:
        e = c.estimate
        assert 0.0 <= e.p_all <= min(e.p_success, e.p_budget, e.p_deadline) <= 1.0
    if policy == "monte_carlo" and fitting:
        assert decision.estimate.p_all == max(c.estimate.p_all for c in fitting)
