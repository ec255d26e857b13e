"""What a run may spend and how long it may take, journaled in its ``run_created`` so a resume applies them again.

``options.limits`` of ``run_created`` is a :class:`LimitsRecord` (from :meth:`RunLimits.journaled`), named field by
field: the budget, the deadline (also as the absolute time ``deadline_at`` on the engine's clock), the model the
run's ``llm`` steps call and, when given, the tier table its ``model: auto`` steps are allocated from, its
deadline-pressure threshold, a goal run's planning modes, parent, origin and endpoint. A resume (``planweave
resume``, a server's recovery, ``POST /runs/{id}/resume``) reads them back with :meth:`JournaledLimits.from_events`
(journals of older versions too): the deadline stays the time it was, and the budget is what is left after the
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

if TYPE_CHECKING:
    from planweave.engine.runtime import Engine, Run
    from planweave.models import Budget

T = TypeVar("T")
_NUMBER = (int, float)

__all__ = ["JournaledLimits", "LimitsRecord", "RunLimits"]


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

    def journaled(self, now: float, model: str | None = None, *, tiers: Mapping[str, Any] | None = None,
                  pressure: float | None = None, cascade: bool | None = None, planner: str | None = None,
                  context: str | None = None, subplans: bool | None = None, parent: Mapping[str, Any] | None = None,
                  origin: str | None = None, base_url: str | None = None, api_key_env: str | None = None,
                  header_names: Sequence[str] | None = None) -> LimitsRecord:
        """These limits as ``run_created`` keeps them (``options.limits``, :class:`LimitsRecord`): the deadline also
        as the absolute time ``deadline_at`` (``now`` on the engine's clock plus the deadline), and the model the
        run's ``llm`` calls; the other fields are kept beside them when given, for a resume to apply again (see
        :class:`LimitsRecord`; ``base_url``, ``api_key_env`` and ``header_names`` are what
        :meth:`planweave.models.Endpoint.journaled` gives: never a key nor a header's value, docs/models.md)."""
        return LimitsRecord(
            self, None if self.deadline is None else now + self.deadline, model,
            tiers=tiers, pressure=pressure, cascade=cascade is True, planner=planner, context=context,
            subplans=subplans, parent=parent, origin=origin, base_url=base_url, api_key_env=api_key_env,
            header_names=None if header_names is None else tuple(header_names))


def _typed(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``record[key]`` if it is a ``kind``, else None: a journal written by another version may lack a field or hold
    another shape, and the run still resumes. A bool is no number here (JSON keeps them apart)."""
    value = record.get(key)
    if isinstance(value, bool) and kind is not bool:
        return None
    return value if isinstance(value, kind) else None


def _whole(record: Mapping[str, Any], key: str) -> int | None:
    """A count (tokens, re-plans) journaled as a JSON number, as an int (None when not a number)."""
    value = _typed(record, key, _NUMBER)
    return None if value is None else int(value)


@dataclass(frozen=True)
class LimitsRecord:
    """What a run's ``run_created`` journals as ``options.limits``, field by field: its :class:`RunLimits`, the
    absolute deadline on the engine's clock, the model its ``llm`` steps call and how it was started (tiers,
    deadline pressure, cascade, planner, planning modes, parent, origin, endpoint), for a resume to apply them again.

    Journaled as a JSON object (:meth:`to_json`, the shape journals have always held: the four limits, ``deadline_at``
    and ``model`` always, the others only when set) and read back with :meth:`from_json`, which takes the objects of
    older versions too (a field missing or of another type reads as not given).
    """

    limits: RunLimits = RunLimits()
    deadline_at: float | None = None  # the absolute end on the engine's clock (seconds since the epoch)
    model: str | None = None  # the model its llm steps call
    tiers: Mapping[str, Any] | None = None  # the tier table its model: auto steps are allocated from (to_mapping)
    pressure: float | None = None  # the deadline-pressure threshold it was given (--deadline-pressure)
    cascade: bool = False  # --cascade: its model: auto steps (a goal run: its planner) cascade over the tiers
    planner: str | None = None  # "auto": a goal run's planner allocated over the tiers (--model auto), not cascaded
    # What a goal run's planner sees of the run ("references" | "summary": PlanningOptions.context) and whether its
    # steps may say tool: plan (False: --no-subplans); None: journaled before they were (today's defaults apply).
    context: str | None = None
    subplans: bool | None = None
    parent: Mapping[str, Any] | None = None  # a sub-plan's parent: run, step, depth (planning/subplans.py)
    origin: str | None = None  # who started a goal run ("POST /runs": a server, whose recovery resumes it)
    base_url: str | None = None  # the endpoint its model is called at, when given (never one with a credential)
    api_key_env: str | None = None  # the name of the variable its key is read from, when given (never the key)
    header_names: tuple[str, ...] | None = None  # the names of the headers sent to it (never their values)

    def to_json(self) -> dict[str, Any]:
        """The ``options.limits`` object of ``run_created``."""
        record: dict[str, Any] = {f.name: getattr(self.limits, f.name) for f in fields(RunLimits)}
        record["deadline_at"] = self.deadline_at
        record["model"] = self.model
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and not (name == "cascade" and value is False):  # cascade: journaled when true
                record[name] = list(value) if name == "header_names" else dict(value) if isinstance(
                    value, Mapping) else value
        return record

    @staticmethod
    def from_json(record: Mapping[str, Any]) -> LimitsRecord:
        """A journaled ``options.limits`` object read back (one of an older version too: see the class)."""
        limits = RunLimits(_typed(record, "budget_usd", _NUMBER), _whole(record, "budget_tokens"),
                           _typed(record, "deadline", _NUMBER), _whole(record, "max_replans"))
        names = record.get("header_names")
        return LimitsRecord(
            limits, _typed(record, "deadline_at", _NUMBER), _typed(record, "model", str),
            tiers=_typed(record, "tiers", Mapping), pressure=_typed(record, "pressure", _NUMBER),
            cascade=record.get("cascade") is True, planner=_typed(record, "planner", str),
            context=_typed(record, "context", str), subplans=_typed(record, "subplans", bool),
            parent=_typed(record, "parent", Mapping), origin=_typed(record, "origin", str),
            base_url=_typed(record, "base_url", str), api_key_env=_typed(record, "api_key_env", str),
            header_names=tuple(str(n) for n in names) if isinstance(names, list) else None)


_OPTIONAL = tuple(f.name for f in fields(LimitsRecord) if f.name not in ("limits", "deadline_at", "model"))


@dataclass(frozen=True)
class JournaledLimits(LimitsRecord):
    """The limits a run was started with, read back from its journal (:class:`LimitsRecord`), and what it has spent
    of them since."""

    spent_usd: float = 0.0  # the model calls' usage, unsettled reservations included at their worst case
    spent_tokens: int = 0
    # Of the spend: the reserved worst case of the calls journaled as model_reserved and never settled (no
    # model_call or model_released with their id: the process died during them).
    unsettled_usd: float = 0.0
    unsettled_tokens: int = 0

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
                found = (event.data.get("options") or {}).get("limits")
                record = found if isinstance(found, Mapping) else {}
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
        read = LimitsRecord.from_json(record)
        return JournaledLimits(**{f.name: getattr(read, f.name) for f in fields(LimitsRecord)},
                               spent_usd=usd + unsettled_usd, spent_tokens=tokens + unsettled_tokens,
                               unsettled_usd=unsettled_usd, unsettled_tokens=unsettled_tokens)

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
        from planweave.engine.runtime import cancel_at_deadline

        remaining = self.remaining_s(engine.clock.now())
        if remaining is not None:
            cancel_at_deadline(engine, run, remaining, deadline=self.limits.deadline)
