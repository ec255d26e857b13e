"""Step defaults: the plan's ``defaults:`` applied to steps that set no value of their own (pure, no I/O).

Precedence for a step's ``timeout``, ``retries`` and ``heartbeat``: the step's own key (``timeout: null`` written on
the step means "no limit") > the plan's ``defaults`` > unset. :func:`validate_plan` applies the plan's defaults, so
every caller (CLI, server, Python API, resume) runs a plan with the same values. The engine itself adds nothing: a
plan built in Python without ``defaults`` has no timeouts. The safe default for plan files,
:data:`DEFAULT_STEP_TIMEOUT`, is added at the CLI edge by :func:`with_default_timeout` (``--step-timeout``
overrides the plan's value). Steps that wait on people (:data:`WAITS_ON_PEOPLE`, and steps with ``approval``)
take no default timeout or heartbeat: only their own ``timeout`` bounds their wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from planweave.core.plan.model import MAX_SECONDS, PlanSpec, Step, StepDefaults

DEFAULT_STEP_TIMEOUT = 600.0
"""Seconds per attempt for steps of a plan file that set no timeout, when neither the plan nor the CLI gives one."""

WAITS_ON_PEOPLE = frozenset({"human.input"})
"""Tools whose calls wait for a person: the default timeout does not apply to them."""

UNBOUNDED_AFTER = 86_400.0
"""A timeout longer than this (a day) is shown as "may wait forever", like no timeout at all."""


def waits_on_people(step: Step) -> bool:
    """Whether the step waits for a person (its tool asks for input, or it needs an approval)."""
    return step.tool in WAITS_ON_PEOPLE or bool(step.approval)


def step_with_defaults(step: Step, defaults: StepDefaults) -> Step:
    """``step`` with the values of ``defaults`` for the keys it does not set itself."""
    given = defaults.model_fields_set
    own = step.model_fields_set
    update: dict[str, object] = {}
    people = waits_on_people(step)
    if "timeout" in given and "timeout" not in own and not people:
        update["timeout"] = defaults.timeout
    if "heartbeat" in given and "heartbeat" not in own and not people:
        update["heartbeat"] = defaults.heartbeat
    if defaults.retries is not None and "retries" not in own:
        update["retries"] = defaults.retries
    return step.model_copy(update=update) if update else step


def may_wait_forever(step: Step) -> bool:
    """Whether an attempt of ``step`` has no effective bound: no timeout, or one longer than a day."""
    return step.timeout is None or step.timeout > UNBOUNDED_AFTER


def unbounded_steps(steps: Iterable[Step]) -> list[str]:
    """The ids of ``steps`` (in the order given) that :func:`may_wait_forever`: what ``"unbounded"`` lists."""
    return [step.id for step in steps if may_wait_forever(step)]


def check_seconds(value: float, name: str) -> float:
    """``value`` if it is a finite number of seconds in ``(0, MAX_SECONDS]``; else ValueError naming ``name``."""
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{name} must be a number of seconds above 0 and at most {MAX_SECONDS:g}, got {value}")
    return value


def with_default_timeout(spec: PlanSpec, override: float | None = None,
                         fallback: float = DEFAULT_STEP_TIMEOUT) -> PlanSpec:
    """``spec`` whose ``defaults.timeout`` is ``override`` if given, else the plan's own value, else ``fallback``.

    The plan's own value may be ``null`` (no limit): that choice is kept unless ``override`` is given.
    """
    if override is None and "timeout" in spec.defaults.model_fields_set:
        return spec
    timeout = override if override is not None else fallback
    fields = {name: getattr(spec.defaults, name) for name in spec.defaults.model_fields_set}
    defaults = StepDefaults.model_validate({**fields, "timeout": timeout})
    return spec.model_copy(update={"defaults": defaults})
