"""A cheap model as a speculation predictor: asked for a running step's output before it exists (docs/speculation.md).

Speculative steps (:mod:`planweave.engine.speculative`) may start on a producer's predicted output. The plan's
``predict:`` and the run's history give predictions for free; a :class:`ModelPredictor` asks a small, fast model for
the others: for an ``llm`` step, the reply to its prompt (``{"text": ...}``); for any other tool, its output as JSON
given the tool's name, description and arguments. Whatever it answers is only a prediction: a step that started on
it is kept only if its real arguments come out the same, so a bad guess costs the predictor's call and the thrown-away
work, never a result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from planweave.core.plan.model import Step
from planweave.core.speculation import PredictorReply
from planweave.models.base import CompletionRequest, Message, ModelClient
from planweave.models.budget import Budget
from planweave.models.errors import BudgetExceeded, ModelError
from planweave.models.pricing import PriceTable, worst_case

__all__ = ["ModelPredictor"]

_LLM_PROMPT = ("Predict the reply an assistant gives to the prompt below. Answer with the predicted reply only, "
               "word for word, nothing else.\n\nPROMPT:\n")
_TOOL_PROMPT = ("Predict the output of a tool call. Answer with the output as one JSON value only.\n\n"
                "TOOL: {tool}\nARGUMENTS: {args}\n")


class ModelPredictor:
    """Predicts step outputs with ``client`` (``model``: a cheap tier's model; None: the client's).

    With a ``budget`` (the run's), each call reserves its worst case first and is not made when that does not fit
    (no prediction, never a wait); it is charged what it cost. :meth:`estimate_usd` gives the speculator that worst
    case, which must fit the policy's ``max_extra_cost_usd`` with what speculation spent already.
    """

    def __init__(self, client: ModelClient, model: str | None = None, *, max_tokens: int = 256,
                 budget: Budget | None = None, prices: PriceTable | None = None) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.budget = budget
        self.prices = prices if prices is not None else PriceTable()

    def _request(self, step: Step, args: Mapping[str, Any]) -> tuple[CompletionRequest, bool]:
        llm = step.tool == "llm" and isinstance(args.get("prompt"), str)
        content = (_LLM_PROMPT + str(args["prompt"]) if llm
                   else _TOOL_PROMPT.format(tool=step.tool, args=json.dumps(dict(args), sort_keys=True)))
        return CompletionRequest((Message("user", content),), model=self.model, max_tokens=self.max_tokens,
                                 temperature=0.0), llm

    def _worst(self, request: CompletionRequest) -> tuple[float | None, int]:
        return worst_case(request, request.model or self.client.model, self.prices)

    def estimate_usd(self, step: Step, args: Mapping[str, Any]) -> float:
        """The most one prediction of ``step`` on ``args`` can cost (0 when the model has no price)."""
        usd, _tokens = self._worst(self._request(step, args)[0])
        return usd or 0.0

    async def predict(self, step: Step, args: Mapping[str, Any]) -> PredictorReply | None:
        """The predicted output of ``step`` on ``args`` and the call's usage; None when the model gives nothing usable
        (an error, no room in the budget, or no JSON for a tool)."""
        request, llm = self._request(step, args)
        reservation = None
        if self.budget is not None:
            usd, tokens = self._worst(request)
            try:
                reservation = self.budget.reserve(usd or 0.0, tokens)
            except BudgetExceeded:
                return None
        try:
            completion = await self.client.complete(request)
        except ModelError:
            if reservation is not None and self.budget is not None:
                self.budget.release(reservation)
            return None
        except BaseException:
            if reservation is not None and self.budget is not None:
                self.budget.release(reservation)
            raise
        if reservation is not None and self.budget is not None:
            self.budget.settle(reservation, completion.cost_usd or 0.0, completion.total_tokens)
        usage = {"model": completion.model, "prompt_tokens": completion.prompt_tokens,
                 "completion_tokens": completion.completion_tokens, "cost_usd": completion.cost_usd or 0.0}
        if llm:
            return PredictorReply({"text": completion.text}, usage)
        try:
            return PredictorReply(json.loads(completion.text), usage)
        except ValueError:
            return PredictorReply(None, usage, guessed=False)  # no JSON: no guess, but the call was paid for
