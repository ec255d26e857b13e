"""The scenario of issue 12 part 0: a goal run whose plan has 12 small ``llm`` steps, under a token budget.

Run against the scripted OpenAI-compatible server on the virtual clock, through :func:`build_planning_loop` (what
``planweave run --goal --budget-tokens N`` builds). The server counts the tokens it sent for every call, cut ones
included (:attr:`ScriptedLLM.served`), so a test can compare what the run reported with what was really spent.
``python -m tests.planning.budget_scenario 2000 3500 4500`` prints status and tokens per budget.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any, Literal

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.engine.runtime import RunResult
from planweave.limits import RunLimits
from planweave.models import Budget, Reservation
from planweave.models.openai import OpenAIChatClient
from planweave.planning import build_planning_loop
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, ServedCall, Text, plan_lines

GOAL = "write one word about each of twelve topics"
STEPS = 12
PROMPT = "In one sentence of about thirty words, say what topic number {} of the twelve is about."
PLAN: list[dict[str, Any]] = [{"id": f"t{i}", "tool": "llm", "args": {"prompt": PROMPT.format(i), "max_tokens": 64}}
        for i in range(1, STEPS + 1)]
REPLY = "Blue, like the sky over the sea on a clear and quiet summer morning."
ANSWER = json.dumps({"answer": "twelve words, one per topic"})


def purpose(req: RecordedRequest) -> str:
    """Which call of the loop a request is: the planner's, the joiner's, a re-plan, or an ``llm`` step's."""
    text = " ".join(str(m.get("content", "")) for m in req.messages)
    if "If the results answer the goal" in text:
        return "join"
    if "Write the plan" in text or "REMAINING plan" in text or "failed for good" in text or "were rejected" in text:
        return "plan"
    return "llm"


def script(req: RecordedRequest, *, usage: bool = True) -> Reply:
    """The model: the 12-step plan (a re-plan keeps nothing more to do: ``[]``), a sentence per step, the answer."""
    kind = purpose(req)
    if kind == "join":
        return Text(ANSWER, usage=usage)
    if kind == "plan":
        first = "Write the plan" in " ".join(str(m.get("content")) for m in req.messages)
        return Text(plan_lines(PLAN) if first else "[]\n", usage=usage)
    return Text(REPLY, usage=usage)


UsageMode = Literal["final", "every", "none"]
"""How the server reports usage in streams: a last chunk (``include_usage``), every chunk, or not at all."""


@dataclass(frozen=True)
class Outcome:
    """One run of the scenario: the run's result and the server's view of it."""

    result: RunResult
    served_tokens: int  # prompt + completion tokens the server sent, over every chat call (cut ones too)
    calls: int
    served: list[ServedCall]  # the server's record of each chat call, in the order they arrived

    @property
    def reported_tokens(self) -> int:
        return int(self.result.summary["tokens"])


async def run_scenario(budget_tokens: int | None, *, tps: float = 100.0, plan_max_tokens: int = 800,
                       usage: UsageMode = "final", budget: Budget | None = None) -> Outcome:
    """Run the goal with ``--budget-tokens budget_tokens`` and the planner capped at ``plan_max_tokens``, against a
    server that honours max_tokens and reports usage as ``usage`` says."""
    server = ScriptedLLM(functools.partial(script, usage=usage != "none"), tokens_per_second=tps,
                         usage_in_every_chunk=usage == "every", honour_max_tokens=True)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=builtin_tools(), clock=VirtualClock()) as engine:
        loop = build_planning_loop(engine, client, builtin_tools(), RunLimits(budget_tokens=budget_tokens),
                                   plan_max_tokens=plan_max_tokens, budget=budget)
        result = await loop.run(GOAL)
    return Outcome(result, sum(c.tokens for c in server.served), len(server.served), server.served)


class RecordingBudget(Budget):
    """A budget that keeps the worst case of every call that asked it for room, in order."""

    def __init__(self, tokens: int | None = None) -> None:
        super().__init__(tokens=tokens)
        self.asked: list[int] = []

    async def acquire(self, estimate_usd: float, estimate_tokens: int, *, floor_tokens: int | None = None,
                      usd_per_token: float | None = None) -> Reservation:
        self.asked.append(estimate_tokens)
        return await super().acquire(estimate_usd, estimate_tokens, floor_tokens=floor_tokens,
                                     usd_per_token=usd_per_token)


def planner_worst_case() -> int:
    """The tokens the scenario's planner reserves for its call (its prompt estimate with the margin, plus 800)."""
    budget = RecordingBudget()
    run_virtual(run_scenario(None, budget=budget))
    return budget.asked[0]


def main(argv: list[str]) -> None:
    for budget in [int(a) for a in argv] or [2000, 3500, 4500]:
        out = run_virtual(run_scenario(budget))
        print(f"--budget-tokens {budget}: {out.result.status}, reported {out.reported_tokens} tokens, server sent "
              f"{out.served_tokens} in {out.calls} calls; {out.result.error or ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
