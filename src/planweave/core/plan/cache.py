"""Which steps may reuse a cached output: the tools' ``cache`` declarations and the plans' overrides (pure).

A tool declares ``cache=True`` or ``cache={"ttl": S}`` (:class:`CachePolicy`); a step may say ``cache: false``
(never), or ``cache: true`` / ``cache: {ttl: S}`` (it is pure even if its tool does not say so); a plan may say
``cache: false``. Only an output that the same call would produce again may be reused, so a step is never cached
when it is not idempotent, writes a resource (``writes:``), waits for a person (``approval:``, ``human.input``), or
its plan or the engine turned the cache off. Where a step *asks* for the cache against these rules, validation
refuses the plan naming the step (:func:`step_cache_problems`); where only its tool declares it, the step simply
runs (the tool's declaration means "cacheable where safe").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planweave.core.plan.catalog import ToolSpec
from planweave.core.plan.model import MAX_SECONDS, CacheSpec, PlanSpec, Step

#: Tools that wait for a person: their answer is never a cached one.
PEOPLE_TOOLS = frozenset({"human.input"})


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """An output may be reused for ``ttl`` seconds after it was produced (``None``: for as long as it is kept)."""

    ttl: float | None = None

    def since(self, now: float) -> float:
        """The oldest production time still usable at ``now``."""
        return -math.inf if self.ttl is None else now - self.ttl


FOREVER = CachePolicy()


def declared_policy(value: bool | Mapping[str, Any] | CachePolicy | None, *, tool: str) -> CachePolicy | None:
    """A tool's ``cache=`` declaration as a policy: ``True``, ``{"ttl": S}`` or a policy; ``False``/``None``: none.

    Raises ValueError naming the tool for anything else (an unknown key, a ttl that is not a positive number).
    """
    if value is None or value is False:
        return None
    if value is True:
        return FOREVER
    if isinstance(value, CachePolicy):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"ttl"})
        if unknown:
            raise ValueError(f"tool '{tool}': cache has no option '{unknown[0]}' (only 'ttl')")
        ttl = value.get("ttl")
        if ttl is None:
            return FOREVER
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_SECONDS:
            raise ValueError(f"tool '{tool}': cache ttl must be a number of seconds above 0, got {ttl!r}")
        return CachePolicy(float(ttl))
    raise ValueError(f"tool '{tool}': cache must be true, false or {{ttl: seconds}}, got {value!r}")


def tool_policy(tool: ToolSpec) -> CachePolicy | None:
    """What ``tool`` declares (tools without a ``cache`` attribute, e.g. MCP tools, declare nothing)."""
    policy = getattr(tool, "cache", None)
    return policy if isinstance(policy, CachePolicy) else None


def tool_version(tool: ToolSpec) -> str:
    """The tool's declared ``version`` (part of every cache key: a new version never reuses an old output)."""
    version = getattr(tool, "version", "")
    return version if isinstance(version, str) else ""


def _idempotent(step: Step, tool: ToolSpec) -> bool:
    return step.idempotent if step.idempotent is not None else tool.idempotent


def step_cache_problems(step: Step, tool: ToolSpec) -> list[tuple[str, str]]:
    """``(field, message)`` for a step whose ``cache:`` asks for reuse where it is not safe."""
    if step.cache is None or step.cache is False:
        return []
    why = _unsafe(step, tool)
    if why is None:
        return []
    return [("cache", f"cannot be cached: {why}")]


def _unsafe(step: Step, tool: ToolSpec) -> str | None:
    if not _idempotent(step, tool):
        return (f"the step is not idempotent (tool '{tool.name}' is not; say `idempotent: true` if the call has "
                "no effects)" if step.idempotent is None else "the step says idempotent: false")
    if step.writes:
        return f"the step writes {', '.join(repr(w) for w in step.writes)}"
    if step.approval:
        return "the step waits for approval"
    if tool.name in PEOPLE_TOOLS:
        return f"tool '{tool.name}' asks a person"
    return None


def step_policy(step: Step, tool: ToolSpec, spec: PlanSpec) -> CachePolicy | None:
    """The policy under which an attempt of ``step`` calling ``tool`` may reuse a cached output (None: never)."""
    if step.cache is False or not spec.cache:
        return None
    if isinstance(step.cache, CacheSpec):
        policy: CachePolicy | None = CachePolicy(step.cache.ttl)
    elif step.cache is True:
        policy = FOREVER
    else:
        policy = tool_policy(tool)
    if policy is None or _unsafe(step, tool) is not None:
        return None
    return policy
