"""The estimator: lognormal fits recover their parameters, few samples stay empirical, success rates are Beta
posteriors, and a step's history combines with its plan's ``estimate:`` as a prior."""

from __future__ import annotations

import math
import random

import pytest

from planweave.core.plan.model import Estimate, Step
from planweave.forecast.estimates import (
    LOGNORMAL_MIN,
    POOL_WEIGHT,
    PRIOR_WEIGHT,
    BetaRate,
    Estimates,
    Observation,
    build_estimates,
    fit,
    fit_duration,
)


def test_lognormal_parameters_are_recovered_from_samples() -> None:
    rng = random.Random(7)
    n = 4000
    samples = [rng.lognormvariate(1.5, 0.4) for _ in range(n)]
    fitted = fit_duration(samples)
    assert fitted.kind == "lognormal"
    # The MLE of mu has standard error sigma/sqrt(n) = 0.0063; of sigma, sigma/sqrt(2n) = 0.0045: 4 errors each.
    assert fitted.mu == pytest.approx(1.5, abs=0.026)
    assert fitted.sigma == pytest.approx(0.4, abs=0.018)
    assert fitted.mean == pytest.approx(math.exp(1.5 + 0.08), rel=0.03)


def test_few_samples_are_sampled_as_they_are() -> None:
    samples = [1.0, 2.0, 4.0]
    assert len(samples) < LOGNORMAL_MIN
    fitted = fit_duration(samples)
    assert fitted.kind == "empirical"
    rng = random.Random(1)
    assert {fitted.sample(rng) for _ in range(200)} == set(samples)
    assert fit_duration([0.0] * LOGNORMAL_MIN).kind == "empirical"  # a zero has no logarithm


def test_success_rate_is_the_beta_posterior_of_the_outcomes() -> None:
    obs = [Observation("tool", "t", 1.0, ok) for ok in [True] * 7 + [False] * 3]
    est = fit("tool", "t", obs)
    assert (est.success.alpha, est.success.beta) == (8.0, 4.0)  # uniform prior Beta(1, 1) plus 7 and 3
    assert est.success.mean == pytest.approx(8 / 12)
    strong = fit("tool", "t", obs, prior=(90.0, 10.0))
    assert strong.success.mean == pytest.approx(97 / 110)
    assert BetaRate.posterior(0, 0).mean == 0.5


def test_tokens_and_cost_are_means_per_attempt() -> None:
    obs = [Observation("model", "m", 2.0, True, 100, 10, 0.01), Observation("model", "m", 4.0, True, 300, 30, 0.03)]
    est = fit("model", "m", obs)
    assert (est.tokens_in, est.tokens_out) == (200.0, 20.0)
    assert est.cost_usd == pytest.approx(0.02)


def step(estimate: Estimate | None = None, tool: str = "work") -> Step:
    return Step(id="s", tool=tool, estimate=estimate)


def test_without_history_the_plan_estimate_is_exact() -> None:
    model = Estimates().step_model(step(Estimate(duration=3.0, cost=0.5)))
    rng = random.Random(0)
    assert {model.sample_duration(rng) for _ in range(50)} == {3.0}
    assert (model.p_success, model.cost_usd) == (1.0, 0.5)


def test_history_and_estimate_combine_with_the_estimate_as_prior_observations() -> None:
    history = build_estimates([Observation("tool", "work", 10.0, i % 4 != 0, cost_usd=1.0) for i in range(8)])
    model = history.step_model(step(Estimate(duration=2.0, cost=0.0)))
    share = PRIOR_WEIGHT / (PRIOR_WEIGHT + 8)
    assert model.prior_share == pytest.approx(share)
    assert model.cost_usd == pytest.approx(1.0 - share)
    overall = (1 + 6) / (2 + 8)  # every attempt of the history, Laplace's rule; the tool's shrunk towards it
    assert model.p_success == pytest.approx((6 + POOL_WEIGHT * overall) / (8 + POOL_WEIGHT))
    rng = random.Random(3)
    draws = [model.sample_duration(rng) for _ in range(4000)]
    assert {round(d, 6) for d in draws} == {2.0, 10.0}  # eight samples of 10 s: a lognormal of width 0
    assert draws.count(2.0) / len(draws) == pytest.approx(share, abs=0.03)


def test_a_repeated_fingerprint_speaks_for_its_step_before_the_tool() -> None:
    obs = [Observation("tool", "work", 1.0, True)] * 5 + [Observation("step", "fp", 9.0, False)] * 2
    table = build_estimates(obs)
    assert table.step_model(step(), "fp").duration.mean == 9.0
    assert table.step_model(step(), "other").duration.mean == 1.0
    once = build_estimates([*obs[:5], Observation("step", "fp", 9.0, False)])
    assert once.step_model(step(), "fp").duration.mean == 1.0  # seen once: not a repetition yet
