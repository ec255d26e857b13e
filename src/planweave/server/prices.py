"""A run posted with a dollar budget over a model without a price is refused (422) before any model call: its calls
would be counted as free and the budget would bound nothing (docs/budgets.md, "Prices")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.server.runs import HTTP_SOURCE

if TYPE_CHECKING:
    from planweave.allocate import TierTable
    from planweave.models import ModelClient

#: How a server is given prices: its process's price file.
HOW_TO_PRICE_SERVER = ("start the server with its price in a file (planweave serve --config prices=FILE, or "
                       "$PLANWEAVE_PRICES; YAML or JSON: {MODEL: {input: USD per 1M tokens, output: USD per 1M "
                       "tokens}})")


def refuse_unpriced(client: ModelClient, budget_usd: float | None, tiers: TierTable | None = None,
                    plan: Any = None) -> None:
    """With a dollar budget, raise PlanInvalid (422, field ``budget_usd``) naming the server's model, or a tier's,
    that has no price in the client's table; ``plan``: a posted plan (a PlanSpec), whose model is called only by
    its ``llm`` steps (a plan without one calls none). A token budget needs no price."""
    if budget_usd is None:
        return
    from planweave.models.pricing import UnpricedModels, calls_llm, require_prices

    if plan is not None and not calls_llm(getattr(plan, "steps", ())):
        return
    models = [client.model, *([] if tiers is None else [tier.model for tier in tiers.tiers.values()])]
    try:
        require_prices(models, budget_usd, getattr(client, "prices", None), budget="budget_usd",
                       how=HOW_TO_PRICE_SERVER)
    except (UnpricedModels, ValueError) as exc:
        raise PlanInvalid([PlanProblem("", "budget_usd", str(exc))], HTTP_SOURCE) from None
