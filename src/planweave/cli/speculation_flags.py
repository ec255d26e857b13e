"""The speculation keys of a run configuration ``run`` and ``resume`` share: ``speculate`` and ``predictor_model``,
and the predictor it opens.

A run's predictor (``speculation: {predictor: {model, base_url?, max_tokens?}}`` in the plan, or the config's
``predictor_model = NAME``) is a cheap model on an OpenAI-compatible endpoint asked for a running producer's output
before it exists; its calls are speculation's extra cost (capped by ``max_extra_cost_usd``) and are charged to the
run's budget (docs/speculation.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from planweave.cli.common import UsageError
from planweave.core.plan.model import PlanSpec, PredictorSpec, SpeculationMode, SpeculationSpec

if TYPE_CHECKING:
    from planweave.core.events import Event
    from planweave.core.speculation import Predictor
    from planweave.models import Budget, Endpoint

def with_predictor(spec: PlanSpec, speculate: SpeculationMode | None,
                   predictor_model: str | None) -> SpeculationSpec | SpeculationMode | None:
    """What a run's ``speculation`` is given the config's ``speculate`` and ``predictor_model`` (UsageError: a
    predictor for a run that does not speculate)."""
    if predictor_model is None:
        return speculate
    from planweave.engine.speculative import resolve_policy

    return _predicting(resolve_policy(spec, speculate), predictor_model)


def resumed_speculation(events: Sequence[Event], speculate: SpeculationMode | None,
                        predictor_model: str | None) -> SpeculationSpec | None:
    """What a resumed run speculates: the policy journaled when it started (``options.speculation``), its mode
    replaced by ``speculate`` (the journaled limits kept) and its predictor's model by ``predictor_model``;
    None: it never speculated and no flag asks it to."""
    from planweave.core.speculation import POLICIES

    journaled = next((SpeculationSpec.model_validate(raw) for e in events if e.kind == "run_created"
                      and (raw := (e.data.get("options") or {}).get("speculation"))), None)
    policy = journaled
    if speculate is not None:
        policy = POLICIES[speculate] if journaled is None else journaled.model_copy(update={"mode": speculate})
    if predictor_model is None:
        return policy
    return _predicting(policy or POLICIES["off"], predictor_model)


def _predicting(policy: SpeculationSpec, predictor_model: str) -> SpeculationSpec:
    """``policy`` with its predictor's model ``predictor_model`` (its base_url and max_tokens kept)."""
    if policy.mode == "off":
        raise UsageError("key 'predictor_model' applies to a run that speculates: give speculate = safe or eager "
                         "too, or a plan with speculation:")
    kept = policy.predictor
    try:
        predictor = PredictorSpec(model=predictor_model, base_url=kept.base_url if kept else None,
                                  max_tokens=kept.max_tokens if kept else 256)
    except ValueError as exc:
        raise UsageError(f"key 'predictor_model': {exc}") from None
    return policy.model_copy(update={"predictor": predictor})


async def open_predictor(stack: AsyncExitStack, policy: SpeculationSpec, endpoint: Endpoint | str | None,
                         budget: Budget | None) -> Predictor | None:
    """The predictor ``policy`` names, its client open for the life of ``stack`` (None: it names none, or does not
    speculate), on the run's ``endpoint`` (a base URL, or with its key variable and headers) unless the plan's
    predictor names a ``base_url`` of its own (then the run's key and headers go with it only if it is the same)."""
    spec = policy.predictor
    if spec is None or policy.mode == "off":
        return None
    from planweave.models import Endpoint, resolve_model
    from planweave.models.predictor import ModelPredictor

    run = endpoint if isinstance(endpoint, Endpoint) else Endpoint(base_url=endpoint)
    given = Endpoint(base_url=spec.base_url).over(run)
    client = await stack.enter_async_context(resolve_model(spec.model, endpoint=given))
    return ModelPredictor(client, spec.model, max_tokens=spec.max_tokens, budget=budget)
