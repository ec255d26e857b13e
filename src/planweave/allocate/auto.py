"""The ``llm`` tool's allocated call: ``model: auto`` asks the seam for a tier and samples, then runs the samples.

:func:`allocated_call` is what ``tools/llm.py`` delegates to when a step says ``model: auto``, ``samples:`` or
``select:``; ``single`` is the tool's own one-call path (reserve, stream, settle, journal), so a sample is charged
and enforced exactly as a plain call is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from planweave.allocate.model import AllocationError, Choice
from planweave.allocate.samples import Verifier, run_samples
from planweave.allocate.seam import AllocationSeam, AutoArgs
from planweave.core.context import current_step
from planweave.core.errors import ToolError
from planweave.models import Budget

WorstCase = Callable[[str], tuple[float | None, int]]
"""A model name -> the worst case (dollars or None without a price, tokens) one call of this step reserves."""


def _fits(budget: Budget | None, worst: WorstCase, model: str, samples: int) -> bool:
    """Whether ``samples`` calls' reserved worst case fits what the budget has left now."""
    if budget is None:
        return True
    usd, tokens = worst(model)
    if budget.usd_limit is not None:
        remaining = budget.remaining_usd
        if usd is None or remaining is None or samples * usd > remaining:
            return False
    remaining_tokens = budget.remaining_tokens
    return remaining_tokens is None or samples * tokens <= remaining_tokens


async def allocated_call(single: Callable[[str], Awaitable[dict[str, Any]]], *, model: str | None,
                         default_model: str, args: Mapping[str, Any], seam: AllocationSeam | None,
                         verifiers: Mapping[str, Verifier], budget: Budget | None, worst: WorstCase
                         ) -> dict[str, Any]:
    """Choose the model and samples (the seam decides for ``model: auto``), run them, return the selected result.

    ``args`` holds the step's ``tiers``, ``samples``, ``max_samples``, ``select`` and ``verifier``. Bad arguments
    raise :class:`ToolError` kind ``arguments`` naming the field.
    """
    verifier_name = args.get("verifier")
    verify: Verifier | None = None
    if verifier_name is not None:
        if verifier_name not in verifiers:
            known = ", ".join(sorted(verifiers)) or "none"
            raise ToolError(f"verifier '{verifier_name}' is not one the llm tool was given (known: {known})",
                            kind="arguments", retryable=False)
        verify = verifiers[verifier_name]
    allocation: dict[str, Any] | None = None
    if model == "auto":
        if seam is None:
            raise ToolError("model: auto needs a tier table: this llm tool was built without an allocator "
                            "(planweave run --tiers FILE, or llm_tool(..., allocation=AllocationSeam(tiers)))",
                            kind="arguments", retryable=False)
        try:
            ctx = current_step()
        except LookupError:
            raise ToolError("model: auto is decided for a step of a run; called outside one", kind="arguments",
                            retryable=False) from None
        try:
            auto = AutoArgs.parse(seam.table, args, step=ctx.step_id)
        except AllocationError as exc:
            raise ToolError(str(exc), kind="arguments", retryable=False) from None
        table = seam.table

        def fits(choice: Choice) -> bool:
            return _fits(budget, worst, table[choice.tier].model, choice.samples)

        left = None
        if budget is not None and budget.usd_limit is not None:
            left = budget.usd_limit - budget.spent_usd
        try:
            decision = await seam.decide(ctx, auto, budget_usd=left, fits=fits)
        except AllocationError as exc:
            raise ToolError(f"allocation: {exc}", kind="arguments", retryable=False) from None
        chosen, samples, select = table[decision.choice.tier].model, decision.choice.samples, auto.select
        allocation = {"tier": decision.choice.tier, "samples": samples, "p_all": round(decision.estimate.p_all, 4)}
    else:
        count = args.get("samples")
        if count == "auto":
            raise ToolError("samples: auto is chosen by the allocator: it needs model: auto", kind="arguments",
                            retryable=False)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ToolError(f"samples must be 'auto' or a count of at least 1, got {count!r}", kind="arguments",
                            retryable=False)
        chosen, samples = model or default_model, int(count or 1)
        select = args.get("select") or ("verifier" if verify is not None else "first_valid")
    if samples == 1 and verify is None:
        result = await single(chosen)
    else:
        result = await run_samples(lambda: single(chosen), samples, select, verify=verify)
    if allocation is not None:
        result["allocation"] = allocation
    return result
