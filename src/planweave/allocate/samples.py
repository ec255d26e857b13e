"""Parallel samples of one model call, and the rule that picks the step's result from them.

``vote``: every sample runs to its end; the output (the parsed JSON, or the text stripped) that more than half of
the samples gave wins; without such a majority the step fails (kind ``no_majority``, retried like any error).
``first_valid``: the first sample to return a valid result (the client checks the step's schema: a reply that does
not match fails that sample) wins, and the others are cancelled at once (a cut stream is charged for what it
sent). ``verifier``: the same, with "valid" meaning the named verifier also accepted the result. The samples run as
tasks of the step's own task (cancelling the step cancels them) and each reserves its own worst case from the
budget, as a single call does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from planweave.allocate.model import Select
from planweave.core.errors import ToolError

SampleCall = Callable[[], Awaitable[dict[str, Any]]]
Verifier = Callable[[dict[str, Any]], Awaitable[bool]]


def output_key(result: dict[str, Any]) -> str:
    """What votes compare: the parsed JSON in canonical form, or the text with outer whitespace removed."""
    if "json" in result:
        return "json:" + json.dumps(result["json"], sort_keys=True, separators=(",", ":"))
    return "text:" + str(result.get("text", "")).strip()


async def run_samples(call: SampleCall, samples: int, select: Select, *, verify: Verifier | None = None
                      ) -> dict[str, Any]:
    """Run ``call`` ``samples`` times at once and return the result ``select`` picks, with a ``samples`` summary.

    Raises :class:`ToolError`: the samples' own error when none gave a result (a budget error first: it is final),
    kind ``no_majority`` when a vote has no majority, kind ``rejected_by_verifier`` when the verifier accepted none.
    """
    if select == "verifier" and verify is None:
        raise ToolError("select: verifier needs a 'verifier' (the name of a verifier the llm tool was given)",
                        kind="arguments", retryable=False)
    tasks = [asyncio.ensure_future(call()) for _ in range(samples)]
    try:
        if select == "vote":
            return await _vote(tasks, samples)
        return await _first(tasks, samples, select, verify)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _summary(select: str, samples: int, valid: int, results: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    cost = sum(float(r.get("cost_usd") or 0.0) for r in results)
    return {"n": samples, "select": select, "valid": valid, "finished": len(results), "cost_usd": cost, **more}


def _failure(errors: list[BaseException]) -> ToolError:
    tool_errors = [e for e in errors if isinstance(e, ToolError)]
    for e in tool_errors:
        if e.kind == "budget":
            return e
    if tool_errors:
        return tool_errors[0]
    return ToolError(f"every sample failed: {errors[0]!r}", kind="error")


async def _vote(tasks: Sequence[asyncio.Future[dict[str, Any]]], samples: int) -> dict[str, Any]:
    done = await asyncio.gather(*tasks, return_exceptions=True)
    results = [r for r in done if isinstance(r, dict)]
    errors = [r for r in done if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, Exception):
            raise e  # a cancellation or an exit: not a sample's failure
    if not results:
        raise _failure(errors)
    counts: dict[str, int] = {}
    for r in results:
        key = output_key(r)
        counts[key] = counts.get(key, 0) + 1
    key, votes = max(counts.items(), key=lambda kv: kv[1])
    if 2 * votes <= samples:
        raise ToolError(f"no majority among {samples} samples: the most common output got {votes} "
                        f"({len(results)} gave a result, {len(counts)} distinct)", kind="no_majority")
    winner = next(r for r in results if output_key(r) == key)
    return {**winner, "samples": _summary("vote", samples, len(results), results, votes=votes)}


async def _first(tasks: Sequence[asyncio.Future[dict[str, Any]]], samples: int, select: Select,
                 verify: Verifier | None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    rejected = 0
    for next_done in asyncio.as_completed(tasks):
        try:
            result = await next_done
        except Exception as exc:  # that sample failed (its schema, the model, the budget): the others go on
            errors.append(exc)
            continue
        results.append(result)
        if verify is not None and select == "verifier" and not await verify(result):
            rejected += 1
            continue
        return {**result, "samples": _summary(select, samples, len(results) - rejected, results,
                                              rejected=rejected)}
    if rejected:
        raise ToolError(f"the verifier rejected all {rejected} results of {samples} samples",
                        kind="rejected_by_verifier")
    raise _failure(errors)
