"""What a run may spend and how long it may take, journaled in its ``run_created`` so a resume applies them again.

``options.limits`` of ``run_created`` (see :meth:`RunLimits.journaled`) holds the budget, the deadline (also as the
absolute time ``deadline_at`` on the engine's clock), the model the run's ``llm`` steps call and, when given, the
tier table its ``model: auto`` steps are allocated from and its deadline-pressure threshold. A resume
(``planweave resume``, a server's recovery, ``POST /runs/{id}/resume``) reads them back with
:meth:`JournaledLimits.from_events`: the deadline stays the time it was, and the budget is what is left after the
run's journaled ``model_call`` usage and the worst case of every ``model_reserved`` call that never settled (a
process killed during it: the provider may have billed up to that). The edges enforce them; the engine only
journals them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from planweave.core.events import Event
from planweave.engine.runtime import Engine, Run, cancel_at_deadline

if TYPE_CHECKING:
    from planweave.models import Budget

T = TypeVar("T")

__all__ = ["JournaledLimits", "RunLimits"]


def _or(value: T | None, default: T | None) -> T | None:
    return default if value is None else value


@dataclass(frozen=True)
class RunLimits:
    """What one run may spend and how long it may take (None: unlimited, or the planning loop's default)."""

    budget_usd: float | None = None
    budget_tokens: int | None = None
    deadline: float | None = None
    max_replans: int | None = None

    def budget(self) -> Budget | None:
        """A fresh :class:`~planweave.models.Budget` for the run's model calls, or None without a budget."""
        if self.budget_usd is None and self.budget_tokens is None:
            return None
        from planweave.models import Budget

        return Budget(usd=self.budget_usd, tokens=self.budget_tokens)

    def journaled(self, now: float, model: str | None = None, **extra: Any) -> dict[str, Any]:
        """These limits as ``run_created`` keeps them (``options.limits``): the deadline also as the absolute time
        ``deadline_at`` (``now`` on the engine's clock plus the deadline), and the model the run's ``llm`` calls.
        ``extra`` (``tiers``: a tier table's :meth:`~planweave.allocate.TierTable.to_mapping`; ``pressure``: a
        deadline-pressure threshold; ``cascade``: True
        for --cascade; ``context`` and ``subplans``: a goal run's planning modes; ``base_url``: the endpoint given
        for its model, ``api_key_env`` the name of the variable its key came from, ``header_names``: never a key nor a
        header's value, docs/models.md) is kept beside them when given, for a resume to apply again."""
        record: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(RunLimits)}
        record["deadline_at"] = None if self.deadline is None else now + self.deadline
        record["model"] = model
        record.update({k: v for k, v in extra.items() if v is not None})
        return record


@dataclass(frozen=True)
class JournaledLimits:
    """The limits a run was started with, read back from its journal, and what it has spent of them since."""

    limits: RunLimits
    deadline_at: float | None = None  # the absolute end on the engine's clock (seconds since the epoch)
    model: str | None = None  # the model its llm steps called
    spent_usd: float = 0.0  # the model calls' usage, unsettled reservations included at their worst case
    spent_tokens: int = 0
    tiers: Mapping[str, Any] | None = None  # the tier table its model: auto steps were allocated from (as journaled)
    pressure: float | None = None  # the deadline-pressure threshold it was given (--deadline-pressure)
    cascade: bool = False  # --cascade: its model: auto steps (a goal run: its planner) cascade over the tiers
    planner: str | None = None  # "auto": a goal run's planner allocated over the tiers (--model auto), not cascaded
    # What a goal run's planner saw of the run ("references" | "summary": PlanningOptions.context) and whether its
    # steps could say tool: plan (False: --no-subplans); None: journaled before they were (today's defaults apply).
    context: str | None = None
    subplans: bool | None = None
    origin: str | None = None  # who started a goal run ("POST /runs": a server, whose recovery resumes it)
    # Of the spend: the reserved worst case of the calls journaled as model_reserved and never settled (no
    # model_call or model_released with their id: the process died during them).
    unsettled_usd: float = 0.0
    unsettled_tokens: int = 0
    base_url: str | None = None  # the endpoint its model was called at, when given (never one with a credential)
    api_key_env: str | None = None  # the name of the variable its key was read from, when given (never the key)

    @staticmethod
    def from_events(events: Sequence[Event]) -> JournaledLimits:
        """The limits of ``run_created`` (none for runs journaled without them), the usage of every ``model_call``
        and the worst case of every ``model_reserved`` left unsettled (read before the run resumes: no call of it is
        in flight, so an open reservation is one a killed process left)."""
        record: Mapping[str, Any] = {}
        usd, tokens = 0.0, 0
        open_calls: dict[str, Mapping[str, Any]] = {}
        for event in events:
            if event.kind == "run_created":
                record = (event.data.get("options") or {}).get("limits") or {}
            elif event.kind == "model_call":
                usd += float(event.data.get("cost_usd") or 0.0)
                tokens += int(event.data.get("prompt_tokens") or 0) + int(event.data.get("completion_tokens") or 0)
                open_calls.pop(str(event.data.get("reservation")), None)
            elif event.kind == "model_reserved":
                open_calls[str(event.data.get("reservation"))] = event.data
            elif event.kind == "model_released":
                open_calls.pop(str(event.data.get("reservation")), None)
        unsettled_usd = sum(float(d.get("cost_usd") or 0.0) for d in open_calls.values())
        unsettled_tokens = sum(int(d.get("tokens") or 0) for d in open_calls.values())
        usd, tokens = usd + unsettled_usd, tokens + unsettled_tokens
        limits = RunLimits(**{f.name: record.get(f.name) for f in fields(RunLimits)})
        tiers = record.get("tiers")
        return JournaledLimits(limits, record.get("deadline_at"), record.get("model"), usd, tokens,
                               tiers if isinstance(tiers, Mapping) else None, record.get("pressure"),
                               record.get("cascade") is True,
                               record.get("planner") if isinstance(record.get("planner"), str) else None,
                               record.get("context") if isinstance(record.get("context"), str) else None,
                               record.get("subplans") if isinstance(record.get("subplans"), bool) else None,
                               record.get("origin") if isinstance(record.get("origin"), str) else None,
                               unsettled_usd, unsettled_tokens,
                               base_url=record.get("base_url") if isinstance(record.get("base_url"), str) else None,
                               api_key_env=record.get("api_key_env") if isinstance(record.get("api_key_env"), str)
                               else None)

    def planning_modes(self, run_id: str) -> tuple[Literal["references", "summary"] | None, bool]:
        """The context and sub-plans a resumed goal run was started with (None, True: journaled before they were,
        today's defaults), for ``planweave resume --model`` and a server's resume alike; raises ValueError naming
        the run for a journaled context this version does not know."""
        known: dict[str, Literal["references", "summary"]] = {"references": "references", "summary": "summary"}
        if self.context is not None and self.context not in known:
            raise ValueError(f"run '{run_id}': its journaled context '{self.context}' is not one of references, "
                             "summary")
        return None if self.context is None else known[self.context], self.subplans is not False

    def with_overrides(self, overrides: RunLimits, now: float) -> JournaledLimits:
        """These limits with the ones given again at resume (a new deadline counts from ``now``)."""
        limits = RunLimits(**{f.name: _or(getattr(overrides, f.name), getattr(self.limits, f.name))
                              for f in fields(RunLimits)})
        deadline_at = self.deadline_at if overrides.deadline is None else now + overrides.deadline
        return replace(self, limits=limits, deadline_at=deadline_at)

    def remaining_s(self, now: float) -> float | None:
        """Seconds left until the deadline at ``now`` (0 once it passed), or None without a deadline."""
        if self.deadline_at is None or not math.isfinite(self.deadline_at):
            return None
        return max(0.0, self.deadline_at - now)

    def budget(self) -> Budget | None:
        """A :class:`~planweave.models.Budget` of the run's limits with what the run spent already charged."""
        budget = self.limits.budget()
        if budget is not None and (self.spent_usd or self.spent_tokens):
            budget.settle(budget.reserve(0.0, 0), self.spent_usd, self.spent_tokens)
        return budget

    def apply_deadline(self, engine: Engine, run: Run) -> None:
        """Cancel ``run`` when the deadline it was started with passes (at once if it passed while it was down)."""
        remaining = self.remaining_s(engine.clock.now())
        if remaining is not None:
            cancel_at_deadline(engine, run, remaining, deadline=self.limits.deadline)
