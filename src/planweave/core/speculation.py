"""Speculation decisions: which waiting steps may start now on predicted inputs, and whether to keep them (pure).

A step may start before its inputs exist when throwing the attempt away costs nothing but the work: it is
idempotent, claims no ``writes:``, waits for nobody (no approval, not ``human.input``) and its tool does not say
``speculate=False``. It starts on *predictions* of the outputs it still waits for: the plan's ``predict:`` of the
producer, the output of an earlier attempt of this run with the same tool and arguments (history) or, in ``eager``
mode, the output of the producer's own speculative attempt (chains). When the producers really finish, the runtime
renders the step's real arguments: equal to the predicted ones (:func:`same_args`), the speculative attempt is
adopted as the step's attempt; otherwise it is thrown away and the step runs on its real inputs. Which output a step
gets therefore never depends on speculation, only when it gets it.

Nothing here does I/O or touches the event loop: :class:`planweave.engine.speculative.Speculator` drives it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from planweave.core.plan.graph import Plan
from planweave.core.plan.model import SpeculationMode, SpeculationSpec, Step, StepStatus
from planweave.core.plan.refs import RefResolutionError, render

PredictionSource = Literal["plan", "history", "model", "speculation"]
"""Where a predicted output comes from: the plan's ``predict:``, an earlier attempt of the run with the same tool
and arguments, a cheap model asked for it (a :class:`Predictor`), or (``eager``) a speculative attempt of the
producer itself."""

OFF = SpeculationSpec(mode="off")
"""No speculation: what a run does when neither its plan nor its caller asks for any."""

SAFE = SpeculationSpec(mode="safe")
EAGER = SpeculationSpec(mode="eager")
POLICIES: Mapping[SpeculationMode, SpeculationSpec] = {"off": OFF, "safe": SAFE, "eager": EAGER}
"""The policy each ``--speculate`` mode names when the plan gives none (a plan's own knobs keep its limits)."""

# Producers in these states will never give an output: nothing waiting on them may speculate.
_DEAD: frozenset[StepStatus] = frozenset({"failed", "skipped", "cancelled", "unknown"})


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted output of a step that has not finished, how much it is trusted, and where it comes from."""

    value: Any
    confidence: float
    source: PredictionSource


@dataclass(frozen=True, slots=True)
class Candidate:
    """A step that may start speculatively now: its arguments rendered on real outputs and predictions."""

    step: str
    args: Mapping[str, Any]
    basis: Mapping[str, PredictionSource]  # producer -> where its predicted output came from
    confidence: float  # the product of the predictions' confidences


@dataclass(frozen=True, slots=True)
class PredictorReply:
    """A predictor's answer: the predicted output, and the usage of the model call behind it (journaled, counted as
    extra cost)."""

    value: Any
    usage: Mapping[str, Any] | None = None
    guessed: bool = True  # False: the call gave nothing usable (its usage still counts)


class Predictor(Protocol):
    """Something asked for a step's output before it exists (e.g. a cheap model: ``planweave.models.predictor``)."""

    async def predict(self, step: Step, args: Mapping[str, Any]) -> PredictorReply | None:
        """The predicted output of ``step`` called with ``args``, or None (no guess)."""
        ...


def unsafe_reason(step: Step, *, idempotent: bool, tool_speculates: bool) -> str | None:
    """Why a step may never start speculatively (a reason naming the rule), or None when it is safe to throw away."""
    if not idempotent:
        return "not idempotent"
    if step.writes:
        return "claims writes: " + ", ".join(step.writes)
    if step.approval:
        return "waits for an approval"
    if step.tool == "human.input":
        return "waits for a person"
    if not tool_speculates:
        return f"tool '{step.tool}' says speculate=False"
    return None


def canonical(value: Any) -> str:
    """One text per JSON value (keys sorted, no spaces): equal texts mean equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def same_args(predicted: Mapping[str, Any], real: Mapping[str, Any]) -> bool:
    """Whether a speculative attempt's arguments are the real ones (canonical JSON equality, so ``1`` and ``1.0``
    differ: a doubt discards, never adopts)."""
    return canonical(predicted) == canonical(real)


def history_key(tool: str, args: Mapping[str, Any]) -> str:
    """The key under which a run remembers a finished attempt's output: its tool and canonical arguments."""
    return tool + "\x00" + canonical(args)


def candidates(
    plan: Plan,
    status: Callable[[str], StepStatus],
    outputs: Mapping[str, Any],
    predictions: Mapping[str, Prediction],
    *,
    safe: Callable[[str], bool],
    policy: SpeculationSpec,
    exclude: Iterable[str] = (),
) -> list[Candidate]:
    """The pending steps that may start speculatively now, critical path first.

    A pending step qualifies when it is ``safe``, not in ``exclude`` (speculating already, or decided), and every
    step it waits for is one it references in its arguments (an ``after:`` alone orders effects, which no
    prediction can stand in for), has a prediction of a source the mode allows, claims no ``writes:`` (its effect
    may be what the step observes) and may still finish. The product of those predictions' confidences must reach
    ``policy.min_confidence``, and the arguments must render on them (a prediction of the wrong shape does not).
    """
    if policy.mode == "off" or not predictions:
        return []
    skip = set(exclude)
    chains = policy.mode == "eager"
    found: list[Candidate] = []
    seen: set[str] = set()
    for producer in predictions:
        for sid in plan.dependents.get(producer, ()):
            if sid in seen or sid in skip:
                continue
            seen.add(sid)
            candidate = _candidate(plan, sid, status, outputs, predictions, safe, policy.min_confidence, chains)
            if candidate is not None:
                found.append(candidate)
    found.sort(key=lambda c: -plan.rank[c.step])  # stable: ties keep plan order
    return found


def _candidate(plan: Plan, sid: str, status: Callable[[str], StepStatus], outputs: Mapping[str, Any],
               predictions: Mapping[str, Prediction], safe: Callable[[str], bool], min_confidence: float,
               chains: bool) -> Candidate | None:
    if status(sid) != "pending" or not safe(sid):
        return None
    referenced = {ref.step for ref in plan.refs[sid]}
    basis: dict[str, PredictionSource] = {}
    values: dict[str, Any] = {}
    confidence = 1.0
    for dep in plan.deps[sid]:
        dep_status = status(dep)
        if dep_status == "succeeded":
            if dep not in outputs:
                return None
            values[dep] = outputs[dep]
            continue
        prediction = predictions.get(dep)
        if (prediction is None or dep not in referenced or dep_status in _DEAD or plan.steps[dep].writes
                or (prediction.source == "speculation" and not chains)):
            return None
        basis[dep] = prediction.source
        values[dep] = prediction.value
        confidence *= prediction.confidence
    if not basis or confidence < min_confidence:
        return None
    try:
        args = render(plan.templates[sid], values) if plan.refs[sid] else plan.templates[sid]
    except (RefResolutionError, TypeError):  # the prediction has another shape than the reference expects
        return None
    if not isinstance(args, Mapping):
        return None
    return Candidate(sid, args, basis, confidence)


@dataclass
class Calibration:
    """How often each source's predictions were right in this run: its confidence is the Beta(1, 1) posterior mean.

    Every producer that finishes with a prediction counts, whether or not a step speculated on it, so a source that
    stopped being trusted can earn trust back (a source starts at 0.5).
    """

    right: dict[PredictionSource, int] = field(default_factory=dict)
    wrong: dict[PredictionSource, int] = field(default_factory=dict)

    def confidence(self, source: PredictionSource) -> float:
        right, wrong = self.right.get(source, 0), self.wrong.get(source, 0)
        return (1 + right) / (2 + right + wrong)

    def observe(self, source: PredictionSource, predicted: Any, actual: Any) -> bool:
        """Count one prediction against the output it predicted; return whether it was right."""
        ok = canonical(predicted) == canonical(actual)
        bucket = self.right if ok else self.wrong
        bucket[source] = bucket.get(source, 0) + 1
        return ok


def within_cost(policy: SpeculationSpec, spent_usd: float, in_flight_usd: float, estimate_usd: float) -> bool:
    """Whether one more speculative attempt estimated at ``estimate_usd`` fits ``max_extra_cost_usd``, counting the
    cost of the discarded attempts (``spent_usd``) and the estimates of those in flight."""
    return spent_usd + in_flight_usd + estimate_usd <= policy.max_extra_cost_usd + 1e-12
