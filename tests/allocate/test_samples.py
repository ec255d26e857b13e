"""Parallel samples and the select rules: vote (a majority), first_valid (the first result, the rest cancelled),
verifier (the first result it accepts); on the virtual clock."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from planweave.allocate import run_samples
from planweave.allocate.model import Select
from planweave.core.clock import run_virtual
from planweave.core.errors import ToolError

Plan = tuple[float, dict[str, Any] | ToolError]  # (seconds, result or error) of one sample


class Samples:
    """A sample call that plays the n-th plan on the n-th call, and records how each ended and when."""

    def __init__(self, plans: Sequence[Plan]) -> None:
        self.plans = plans
        self.next = itertools.count()
        self.ended: dict[int, str] = {}

    def call(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def one() -> dict[str, Any]:
            i = next(self.next)
            seconds, outcome = self.plans[i]
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                self.ended[i] = f"cancelled at {asyncio.get_running_loop().time():g}"
                raise
            self.ended[i] = f"done at {asyncio.get_running_loop().time():g}"
            if isinstance(outcome, ToolError):
                raise outcome
            return outcome
        return one


def text(value: str, cost: float = 0.01) -> dict[str, Any]:
    return {"text": value, "cost_usd": cost}


def play(plans: Sequence[Plan], select: Select, verify: Callable[[dict[str, Any]], Awaitable[bool]] | None = None
         ) -> tuple[dict[str, Any] | ToolError, Samples, float]:
    samples = Samples(plans)

    async def main() -> tuple[dict[str, Any] | ToolError, float]:
        start = asyncio.get_running_loop().time()
        try:
            result: dict[str, Any] | ToolError = await run_samples(samples.call(), len(plans), select, verify=verify)
        except ToolError as exc:
            result = exc
        return result, asyncio.get_running_loop().time() - start

    result, took = run_virtual(main())
    return result, samples, took


def test_a_vote_takes_the_output_most_samples_agree_on_after_all_of_them() -> None:
    result, samples, took = play([(1, text("A")), (3, text(" B ")), (2, text("A "))], "vote")
    assert isinstance(result, dict)
    assert result["text"] == "A" and result["samples"]["votes"] == 2 and result["samples"]["n"] == 3
    assert result["samples"]["cost_usd"] == pytest.approx(0.03)
    assert took == pytest.approx(3.0)  # it waits for every sample
    assert all(e.startswith("done") for e in samples.ended.values())


def test_a_vote_without_a_majority_fails_and_failed_samples_count_against_it() -> None:
    result, _, _ = play([(1, text("A")), (1, text("B")), (1, text("C"))], "vote")
    assert isinstance(result, ToolError) and result.kind == "no_majority" and result.retryable
    bad = ToolError("not json", kind="malformed_output")
    result, _, _ = play([(1, text("A")), (1, bad), (1, bad)], "vote")
    assert isinstance(result, ToolError) and result.kind == "no_majority"
    result, _, _ = play([(1, text("A")), (1, text("A")), (1, bad)], "vote")
    assert isinstance(result, dict) and result["text"] == "A"


def test_first_valid_returns_the_first_result_and_cancels_the_others() -> None:
    bad = ToolError("not json", kind="malformed_output")
    result, samples, took = play([(5, text("slow")), (1, bad), (2, text("second"))], "first_valid")
    assert isinstance(result, dict) and result["text"] == "second"
    assert took == pytest.approx(2.0)
    assert samples.ended == {0: "cancelled at 2", 1: "done at 1", 2: "done at 2"}
    assert result["samples"] == {"n": 3, "select": "first_valid", "valid": 1, "finished": 1, "cost_usd": 0.01,
                                 "rejected": 0}


def test_when_every_sample_fails_the_step_fails_with_their_error_a_budget_error_first() -> None:
    model = ToolError("boom", kind="provider_error")
    budget = ToolError("budget exceeded", kind="budget", retryable=False)
    result, _, _ = play([(1, model), (2, model)], "first_valid")
    assert isinstance(result, ToolError) and result.kind == "provider_error"
    result, _, _ = play([(1, model), (2, budget)], "first_valid")
    assert isinstance(result, ToolError) and result.kind == "budget" and not result.retryable
    result, _, _ = play([(1, model), (2, budget)], "vote")
    assert isinstance(result, ToolError) and result.kind == "budget"


def test_a_verifier_takes_the_first_result_it_accepts() -> None:
    seen: list[str] = []

    async def verify(result: dict[str, Any]) -> bool:
        seen.append(result["text"])
        return bool(result["text"] == "right")

    result, samples, took = play([(1, text("wrong")), (2, text("right")), (3, text("late"))], "verifier", verify)
    assert isinstance(result, dict) and result["text"] == "right" and result["samples"]["rejected"] == 1
    assert seen == ["wrong", "right"] and took == pytest.approx(2.0) and samples.ended[2] == "cancelled at 2"
    result, _, _ = play([(1, text("wrong")), (2, text("also"))], "verifier", verify)
    assert isinstance(result, ToolError) and result.kind == "rejected_by_verifier"
    result, _, _ = play([(1, text("x"))], "verifier")
    assert isinstance(result, ToolError) and result.kind == "arguments"
