"""The ``prices`` key of a run configuration (else ``$PLANWEAVE_PRICES``) of the commands that call models, and the
check that a dollar budget names only models with a price (exit 2 before any model call otherwise; docs/budgets.md,
"Prices")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planweave.cli.common import UsageError

if TYPE_CHECKING:
    from planweave.allocate.model import TierTable
    from planweave.core.plan.model import PlanSpec


def use_price_file(path: Path | None, label: str = "--prices") -> None:
    """Make ``--prices FILE`` the process's prices (None: nothing to do); a bad file exits 2 naming it (after
    ``label``: the flag, or the config key and its file)."""
    if path is None:
        return
    from planweave.models.pricing import use_prices

    try:
        use_prices(path)
    except ValueError as exc:
        raise UsageError(f"{label}: {exc}") from None


def called_models(model: str | None, tiers: TierTable | None = None, *others: str | None) -> list[str]:
    """The models a run calls: ``model`` (not ``auto``, which the tiers stand for), every tier's, the ``others``."""
    named = [] if model in (None, "auto") else [model]
    named += [] if tiers is None else [tier.model for tier in tiers.tiers.values()]
    return [m for m in (*named, *others) if m is not None]


def queued_models(spec: PlanSpec, model: str | None, tiers: Mapping[str, Any] | None) -> list[str]:
    """The models a queued plan's ``llm`` steps call (none without one): ``model`` and the tiers' (``submit``)."""
    from planweave.models.pricing import calls_llm

    if model is None or not calls_llm(spec.steps):
        return []
    return [model, *(str(tier["model"]) for tier in (tiers or {}).values())]


def require_priced(models: Iterable[str], budget_usd: float | None, flag: str = "--budget-usd") -> None:
    """With a dollar budget, exit 2 naming every model in ``models`` without a price (its calls would count as
    free) and how to give one; a token budget, or none, needs no price."""
    if budget_usd is None:
        return
    from planweave.models.pricing import UnpricedModels, require_prices

    try:
        require_prices(models, budget_usd, budget=flag)
    except UnpricedModels as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a bad $PLANWEAVE_PRICES file read for the first time
        raise UsageError(str(exc)) from None
