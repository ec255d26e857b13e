"""The ``llm`` tool: a plan step that asks a model, optionally for JSON matching a schema, within a budget.

Plan files call it as ``tool: llm`` with ``args: {prompt: "Summarise ${fetch.body}", schema: {...}}``; by the time
the tool runs the engine has substituted the references. It returns ``{"text": ...}`` (or ``{"json": ...}`` when a
schema was given) with ``tokens``, ``cost_usd`` and ``model``. :func:`llm_tool` binds it to a configured client
and budget, so the CLI decides which model serves plan steps.
"""

from __future__ import annotations

import math
from contextlib import aclosing
from typing import Any

from planweave.engine.context import current_step
from planweave.errors import ToolError
from planweave.models import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_TOKENS,
    Budget,
    BudgetExceeded,
    Completion,
    CompletionRequest,
    Delta,
    LocalModelUnavailable,
    MalformedOutput,
    ModelClient,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    PriceTable,
    ProviderError,
    RateLimited,
    Reservation,
    approx_prompt_tokens,
    check_schema,
    worst_case,
)
from planweave.tools.registry import Tool


def tool_error(exc: ModelError | BudgetExceeded) -> ToolError:
    """The ToolError a step fails with for a model or budget error: its kind, and whether a retry may help."""
    kind: str
    retryable: bool
    if isinstance(exc, BudgetExceeded):
        kind, retryable = "budget", False
    elif isinstance(exc, RateLimited):
        kind, retryable = "rate_limited", True
    elif isinstance(exc, ProviderError):
        kind, retryable = "provider_error", exc.retryable
    elif isinstance(exc, ModelTimeout):
        kind, retryable = "timeout", True
    elif isinstance(exc, LocalModelUnavailable):
        kind, retryable = "unavailable", False
    elif isinstance(exc, ModelUnavailable):
        kind, retryable = "unavailable", True
    elif isinstance(exc, MalformedOutput):
        kind, retryable = "malformed_output", True  # sampling again may well give valid JSON
    else:
        kind, retryable = "model_error", exc.retryable
    return ToolError(str(exc), kind=kind, retryable=retryable)


def llm_tool(  # noqa: C901 (builds the tool and its nested call)
    client: ModelClient,
    budget: Budget | None = None,
    *,
    default_model: str | None = None,
    prices: PriceTable | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    name: str = "llm",
) -> Tool:
    """Build the ``llm`` tool calling ``client`` (``default_model`` or the client's model unless a step names one).

    With a ``budget``, each call reserves its worst case (prompt estimate with a margin, plus ``max_tokens``) before
    it starts and settles with the actual usage after; a call that does not fit fails with kind ``budget``. A USD
    budget needs a price for the model (``prices``, default the built-in table), or the call is refused.
    """
    table = prices if prices is not None else PriceTable()

    def reserve(request: CompletionRequest, model: str) -> Reservation | None:
        if budget is None:
            return None
        usd, tokens = worst_case(request, model, table, default_max_tokens=default_max_tokens)
        if usd is None:
            if budget.usd_limit is not None:
                raise ToolError(
                    f"model '{model}' has no price in the price table, so a budget in USD cannot bound its calls: "
                    "add its price (a prices file) or use a token budget",
                    kind="budget", retryable=False,
                )
            usd = 0.0
        return budget.reserve(usd, tokens)

    async def llm(
        prompt: str,
        system: str | None = None,
        schema: dict[str, Any] | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        """Ask a language model; with ``schema`` (a JSON schema) the reply is parsed JSON matching it.

        Returns ``text`` (or ``json``), ``tokens`` (prompt, completion, total, estimated), ``cost_usd`` and
        ``model``.
        """
        if max_tokens is not None and max_tokens < 1:
            raise ToolError(f"max_tokens must be at least 1, got {max_tokens}", kind="arguments", retryable=False)
        if temperature is not None and not 0 <= temperature <= 2:
            raise ToolError(f"temperature must be between 0 and 2, got {temperature}", kind="arguments",
                            retryable=False)
        if schema is not None:
            try:
                check_schema(schema)
            except ValueError as exc:
                raise ToolError(f"schema: {exc}", kind="arguments", retryable=False) from None
        chosen = model or default_model or client.model
        request = CompletionRequest.of(
            prompt, system=system, model=chosen, max_tokens=max_tokens or default_max_tokens,
            temperature=temperature, schema=schema,
        )
        try:
            reservation = reserve(request, chosen)
        except BudgetExceeded as exc:
            raise tool_error(exc) from None
        received = 0
        completion: Completion | None = None
        try:
            async with aclosing(client.stream(request)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, Delta):
                        received += len(chunk.text)
                    else:
                        completion = chunk
        except ModelError as exc:
            raise tool_error(exc) from None
        finally:
            if reservation is not None and budget is not None:
                if completion is not None:
                    budget.settle(reservation, completion.cost_usd or 0.0, completion.total_tokens)
                elif received:
                    # Failed or cancelled mid-stream: the provider bills what it generated; estimate it.
                    prompt_tokens = approx_prompt_tokens(m.content for m in request.messages)
                    out_tokens = math.ceil(received / CHARS_PER_TOKEN)
                    cost = table.cost(chosen, prompt_tokens, out_tokens) or 0.0
                    budget.settle(reservation, min(cost, reservation.usd),
                                  min(prompt_tokens + out_tokens, reservation.tokens))
                else:
                    budget.release(reservation)
        if completion is None:
            raise ToolError(f"model '{chosen}': the stream ended without a completion", kind="provider_error")
        result: dict[str, Any] = {"json": completion.parsed} if schema is not None else {"text": completion.text}
        result["tokens"] = {
            "prompt": completion.prompt_tokens,
            "completion": completion.completion_tokens,
            "total": completion.total_tokens,
            "estimated": completion.usage_source == "estimated",
        }
        result["cost_usd"] = completion.cost_usd
        result["model"] = completion.model
        try:
            step = current_step()
        except LookupError:  # called outside a run (directly, in a test): nothing to journal
            pass
        else:  # the run journals the call and counts its tokens and cost
            step.report_usage({
                "purpose": "llm_step", "model": completion.model, "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens, "cost_usd": completion.cost_usd or 0.0,
                "usage_source": completion.usage_source,
            })
        return result

    return Tool.from_function(llm, name=name, idempotent=True)

