"""Tier profiles from history: a declared tier table combined with the estimates a journal's runs give its models.

Pure (the estimates are read elsewhere: ``forecast/history.py``). Each tier's declared profile is the prior and
counts as :data:`PRIOR_WEIGHT` calls against the ``n`` calls the estimates hold for its model: with ``share =
PRIOR_WEIGHT / (PRIOR_WEIGHT + n)``,

- ``p_success`` is the Beta posterior whose prior is the declared rate with that weight (``share * p + (1 - share)
  * observed rate``, the observed rate counting each call with the outcome of the attempt it was made in);
- the median duration is the geometric mix of the declared and the fitted median (the lognormal's ``mu`` mixed),
  ``duration_sigma`` the linear mix of the two sigmas;
- ``cost_usd`` and ``tokens`` are the linear mix of the declared and the mean per call.

A model with no history keeps its declared profile; the more history, the less the declaration counts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace

from planweave.allocate.model import TierProfile, TierTable
from planweave.forecast.estimates import Duration, Estimate, Estimates

PRIOR_WEIGHT = 2.0
"""How many calls a tier's declared profile counts as, against its model's history."""


@dataclass(frozen=True, slots=True)
class Fitted:
    """A tier table fitted from history, and per tier the calls of history it took in (0: the declared profile)."""

    table: TierTable
    calls: Mapping[str, int]


def _median_sigma(duration: Duration) -> tuple[float, float]:
    """The median seconds and the log-sigma of a fitted duration (an empirical one: its median, the spread of its
    logs when all are positive, else 0)."""
    if duration.kind == "lognormal":
        return math.exp(duration.mu), duration.sigma
    if duration.kind == "fixed":
        return duration.value, 0.0
    samples = duration.samples
    median = statistics.median(samples)
    if len(samples) > 1 and min(samples) > 0:
        return median, statistics.pstdev(math.log(s) for s in samples)
    return median, 0.0


def fitted_profile(tier: TierProfile, found: Estimate | None, weight: float = PRIOR_WEIGHT) -> TierProfile:
    """``tier`` combined with its model's estimate ``found`` (None or no calls: ``tier`` as declared)."""
    if found is None or found.n <= 0:
        return tier
    share = weight / (weight + found.n)
    ok = found.success.alpha - 1.0  # the estimates' Beta has a uniform prior: take its counts back out
    p = (weight * tier.p_success + ok) / (weight + found.n)
    median, sigma = _median_sigma(found.duration)
    if tier.duration_s > 0 and median > 0:
        duration = math.exp(share * math.log(tier.duration_s) + (1.0 - share) * math.log(median))
    else:
        duration = share * tier.duration_s + (1.0 - share) * median
    return replace(
        tier, p_success=min(1.0, max(0.0, p)), duration_s=duration,
        duration_sigma=share * tier.duration_sigma + (1.0 - share) * sigma,
        cost_usd=share * tier.cost_usd + (1.0 - share) * found.cost_usd,
        tokens=round(share * tier.tokens + (1.0 - share) * (found.tokens_in + found.tokens_out)),
    )


def fitted_table(table: TierTable, estimates: Estimates, weight: float = PRIOR_WEIGHT) -> Fitted:
    """Every tier of ``table`` combined with the history ``estimates`` hold for its model."""
    tiers: dict[str, TierProfile] = {}
    calls: dict[str, int] = {}
    for name, tier in table.tiers.items():
        found = estimates.get("model", tier.model)
        tiers[name] = fitted_profile(tier, found, weight)
        calls[name] = found.n if found is not None else 0
    return Fitted(TierTable(tiers), calls)
