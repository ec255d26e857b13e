"""The ``llm`` tool: a plan step that asks a model, optionally for JSON matching a schema, within a budget.

Plan files call it as ``tool: llm`` with ``args: {prompt: "Summarise ${fetch.body}", schema: {...}}``; by the time
the tool runs the engine has substituted the references. It returns ``{"text": ...}`` (or ``{"json": ...}`` when a
schema was given) with ``tokens``, ``cost_usd`` and ``model``. :func:`llm_tool` binds it to a configured client
and budget, so the CLI decides which model serves plan steps.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping
from contextlib import aclosing
from typing import Any, Literal

from planweave.allocate import AllocationSeam, Verifier, allocated_call
from planweave.allocate.cascade_seam import CascadeSeam, cascaded_call
from planweave.core.context import current_step
from planweave.core.errors import ToolError
from planweave.models import (
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
    StreamMeter,
    Usage,
    acquire_call,
    approx_prompt_tokens,
    check_schema,
    worst_case,
)
from planweave.tools.llm_calls import DEFAULT_TOOL_ROUNDS, Conversation, RejectedReply, converse
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


def _report(model: str, usage: Usage, cost: float | None, *, cut: str | None = None,
            reservation: str | None = None) -> None:
    """Journal a call through the step running it (the run counts its tokens and cost); nothing outside a run."""
    try:
        step = current_step()
    except LookupError:  # called outside a run (directly, in a test): nothing to journal
        return
    data: dict[str, Any] = {
        "purpose": "llm_step", "model": model, "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens, "cost_usd": cost or 0.0, "usage_source": usage.source,
    }
    if cut is not None:
        data["cut"] = cut  # the stream ended early (the exception that ended it): charged for what it sent
    if reservation is not None:
        data["reservation"] = reservation  # settles the call's model_reserved
    step.report_usage(data)


async def _journal_reservation(reservation: Reservation, model: str) -> str | None:
    """Journal a budgeted call's worst case through the step running it, durably, before its request goes out (so a
    resume after a kill counts it spent); return the call's id for its ``model_call``, None outside a run."""
    try:
        step = current_step()
    except LookupError:
        return None
    call_id = secrets.token_hex(8)
    try:
        await step.report_reservation({"reservation": call_id, "purpose": "llm_step", "model": model,
                                       "tokens": reservation.tokens, "cost_usd": reservation.usd})
    except BaseException:  # cancelled while it was written, or refused: the call never goes out
        with contextlib.suppress(Exception):
            step.report_release({"reservation": call_id, "reason": "not sent"})
        raise
    return call_id


def _journal_release(call_id: str | None, reason: str) -> None:
    """Journal that the reserved call ``call_id`` cost nothing (no resume counts it)."""
    if call_id is not None:
        current_step().report_release({"reservation": call_id, "reason": reason})


def call_figures(completion: Completion) -> dict[str, Any]:
    """A call's ``tokens`` (prompt, completion, total, estimated), ``cost_usd`` and ``model``, as a step returns
    them."""
    return {"tokens": {"prompt": completion.prompt_tokens, "completion": completion.completion_tokens,
                       "total": completion.total_tokens, "estimated": completion.usage_source == "estimated"},
            "cost_usd": completion.cost_usd, "model": completion.model}


def llm_tool(  # noqa: C901 (builds the tool and its nested call)
    client: ModelClient,
    budget: Budget | None = None,
    *,
    default_model: str | None = None,
    prices: PriceTable | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    min_tokens: int = 64,
    name: str = "llm",
    allocation: AllocationSeam | None = None,
    verifiers: Mapping[str, Verifier] | None = None,
    cascade: CascadeSeam | None = None,
) -> Tool:
    """Build the ``llm`` tool calling ``client`` (``default_model`` or the client's model unless a step names one).

    With a ``budget``, each call reserves its worst case (prompt estimate with a margin, plus ``max_tokens``) before
    it starts, waiting while other calls' reservations are open (:meth:`Budget.acquire`); once nothing in flight can
    free room, it runs with ``max_tokens`` lowered to what remains, down to ``min_tokens`` (its floor), and only
    below that fails with kind ``budget``. It settles the moment it ends, a cut stream for what it had cost. A USD
    budget needs a price for the model (``prices``, default the built-in table), or the call is refused. In a run,
    the reservation is journaled (``model_reserved``, durable) before the request goes out and its ``model_call``
    names it, so a resume after a kill counts a call left unsettled at its worst case (docs/budgets.md).

    ``allocation`` (an :class:`~planweave.allocate.AllocationSeam`) decides steps saying ``model: auto``: tier and
    parallel samples, each sample reserved and charged as one call; ``verifiers`` are the named checks ``select:
    verifier`` may use (docs/allocation.md). ``cascade`` (a :class:`~planweave.allocate.cascade_seam.CascadeSeam`)
    gives steps saying ``model: cascade`` their tier per attempt, cheapest first, escalating when a monitor fires
    (default: one on ``allocation``'s table, when that is given).
    """
    table = prices if prices is not None else PriceTable()
    # The step argument ``cascade`` (its settings) shadows the name inside ``llm``. Without a cascade of its own, a
    # tool with an allocator cascades on the allocator's table and runs (resume, workers and the server build one).
    cascade_seam = cascade if cascade is not None or allocation is None else CascadeSeam(
        allocation.table, allocation.read_run, hurried=allocation.hurried)

    async def reserve(request: CompletionRequest, model: str) -> tuple[Reservation | None, CompletionRequest]:
        if budget is None:
            return None, request
        usd, tokens = worst_case(request, model, table, default_max_tokens=default_max_tokens)
        if usd is None:
            if budget.usd_limit is not None:
                raise ToolError(
                    f"model '{model}' has no price in the price table, so a budget in USD cannot bound its calls: "
                    "add its price (a prices file) or use a token budget",
                    kind="budget", retryable=False,
                )
            usd = 0.0
        price = table.lookup(model)  # a reply token's price: a dollar budget's call is lowered too
        return await acquire_call(budget, request, usd, tokens, floor_tokens=min_tokens,
                                  usd_per_token=None if price is None else price.output / 1e6)

    def settle(reservation: Reservation | None, request: CompletionRequest, meter: StreamMeter,
               completion: Completion | None, cut: BaseException | None, call_id: str | None) -> None:
        """Charge the call the moment it ends; a stream cut by an error or a cancellation is charged, and journaled
        (``cut``, usage ``estimated`` unless the server's counts cover it), for what it had cost."""
        if completion is not None:
            if reservation is not None and budget is not None:
                budget.settle(reservation, completion.cost_usd or 0.0, completion.total_tokens)
            return
        if not meter.received:
            if reservation is not None and budget is not None:
                budget.release(reservation)
            _journal_release(call_id, type(cut).__name__ if cut is not None else "ended")
            return
        usage = meter.spent()
        model = request.model or client.model
        cost = table.cost(model, usage.prompt_tokens, usage.completion_tokens)
        if reservation is not None and budget is not None:
            budget.settle(reservation, cost or 0.0, usage.total_tokens)
        _report(model, usage, cost, cut=type(cut).__name__ if cut is not None else "ended", reservation=call_id)

    async def llm(
        prompt: str,
        system: str | None = None,
        schema: dict[str, Any] | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tiers: list[str] | None = None,
        samples: int | Literal["auto"] | None = None,
        max_samples: int | None = None,
        select: Literal["vote", "first_valid", "verifier"] | None = None,
        verifier: str | None = None,
        cascade: bool | dict[str, Any] | None = None,
        tools: list[str | dict[str, Any]] | None = None,
        max_tool_rounds: int = DEFAULT_TOOL_ROUNDS,
    ) -> dict[str, Any]:
        """Ask a language model; with ``schema`` (a JSON schema) the reply is parsed JSON matching it.

        Returns ``text`` (or ``json``), ``tokens`` (prompt, completion, total, estimated), ``cost_usd`` and
        ``model``. ``model: auto`` lets the allocator choose among ``tiers`` (and, with ``samples: auto``, how many
        parallel samples, picked by ``select``); ``model: cascade`` runs the cheapest of ``tiers`` first and
        escalates when a monitor fires (``cascade:`` its settings); see docs/allocation.md. ``tools`` (names of the
        run's tools, or ``{tool: name, <step keys>}``) are offered to the model as functions: each call it makes
        runs as a step of the run, for at most ``max_tool_rounds`` rounds; a reply not matching ``schema`` gets one
        repair round trip (docs/tools.md, "The llm tool: tools and schema").
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
        plain = (model not in ("auto", "cascade") and cascade in (None, False) and samples is None
                 and select is None and verifier is None)
        if tools is not None or (schema is not None and plain):
            if tools is not None and (model in ("auto", "cascade") or samples is not None or cascade not in (
                    None, False)):
                raise ToolError("tools cannot be combined with model auto/cascade, samples or cascade: give the "
                                "step a model", kind="arguments", retryable=False)
            chosen = model or default_model or client.model
            return await converse(
                ask, Conversation(prompt=prompt, system=system, schema=schema, model=chosen,
                                  max_tokens=max_tokens or default_max_tokens, temperature=temperature,
                                  tools=tools or [], max_rounds=max_tool_rounds))
        if model == "cascade" or (model in (None, "auto") and cascade not in (None, False)) or (
                model == "auto" and cascade is None and cascade_seam is not None and cascade_seam.auto):
            return await cascaded_call(
                lambda m, tick, top: call(prompt, system, schema, m, max_tokens, temperature, on_chunk=tick,
                                          logprobs=top),
                seam=cascade_seam, verifiers=verifiers or {},
                args={"tiers": tiers, "samples": samples, "select": select, "verifier": verifier, "cascade": cascade})
        if model == "auto" or samples is not None or select is not None or verifier is not None:
            def worst(m: str) -> tuple[float | None, int]:
                probe = CompletionRequest.of(prompt, system=system, model=m, schema=schema,
                                             max_tokens=max_tokens or default_max_tokens)
                return worst_case(probe, m, table, default_max_tokens=default_max_tokens)

            return await allocated_call(
                lambda m: call(prompt, system, schema, m, max_tokens, temperature),
                model=model, default_model=default_model or client.model, seam=allocation, verifiers=verifiers or {},
                budget=budget, worst=worst, args={"tiers": tiers, "samples": samples, "max_samples": max_samples,
                                                  "select": select, "verifier": verifier},
            )
        return await call(prompt, system, schema, model, max_tokens, temperature)

    async def call(prompt: str, system: str | None, schema: dict[str, Any] | None, model: str | None,
                   max_tokens: int | None, temperature: float | None, *, on_chunk: Callable[[], None] | None = None,
                   logprobs: int | None = None) -> dict[str, Any]:
        """One model call of a step (reserve, stream, settle, journal); ``on_chunk`` is told once the budget had
        room and at each streamed chunk, ``logprobs`` asks for each token's top logprobs (returned as
        ``logprobs``)."""
        chosen = model or default_model or client.model
        request = CompletionRequest.of(
            prompt, system=system, model=chosen, max_tokens=max_tokens or default_max_tokens,
            temperature=temperature, schema=schema, logprobs=logprobs,
        )
        completion = await ask(request, on_chunk=on_chunk)
        result: dict[str, Any] = {"json": completion.parsed} if schema is not None else {"text": completion.text}
        result.update(call_figures(completion))
        if logprobs is not None:
            result["logprobs"] = [list(top) for top in completion.logprobs or ()]
        return result

    async def ask(request: CompletionRequest, *, on_chunk: Callable[[], None] | None = None,
                  malformed: bool = False) -> Completion:
        """Run ``request`` as one budgeted, journaled call and return its completion; ``malformed``: a reply not
        matching the request's schema raises :class:`RejectedReply` (the caller repairs it), not a ToolError."""
        chosen = request.model or client.model
        try:
            reservation, request = await reserve(request, chosen)
        except BudgetExceeded as exc:
            raise tool_error(exc) from None
        call_id = None
        if reservation is not None and budget is not None:
            try:
                call_id = await _journal_reservation(reservation, chosen)
            except BaseException:
                budget.release(reservation)
                raise
        if on_chunk is not None:
            on_chunk()  # a wait for budget room is not the model being silent
        meter = StreamMeter(approx_prompt_tokens(m.content for m in request.messages))
        completion: Completion | None = None
        cut: BaseException | None = None
        try:
            async with aclosing(client.stream(request)) as chunks:
                async for chunk in chunks:
                    meter.feed(chunk)
                    if on_chunk is not None:
                        on_chunk()
                    if not isinstance(chunk, Delta):
                        completion = chunk
        except MalformedOutput as exc:
            cut = exc
            if malformed:
                spent = meter.spent()
                raise RejectedReply(str(exc), exc.text, spent,
                                    table.cost(chosen, spent.prompt_tokens, spent.completion_tokens)) from None
            raise tool_error(exc) from None
        except ModelError as exc:
            cut = exc
            raise tool_error(exc) from None
        except BaseException as exc:  # cancelled (the run stopped, a timeout): still charged for what it sent
            cut = exc
            raise
        finally:
            settle(reservation, request, meter, completion, cut, call_id)
        if completion is None:
            raise ToolError(f"model '{chosen}': the stream ended without a completion", kind="provider_error")
        _report(completion.model, Usage(completion.prompt_tokens, completion.completion_tokens,
                                        completion.usage_source), completion.cost_usd, reservation=call_id)
        return completion

    return Tool.from_function(llm, name=name, idempotent=True)

