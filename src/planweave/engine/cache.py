"""The result cache of a run: which attempts may reuse an output, their keys, and the journal's answer.

A cacheable attempt (:func:`planweave.core.plan.cache.step_policy`) has a key: the sha256 of the canonical JSON of the
tool's name, its declared ``version`` and the rendered arguments (:func:`cache_key`). Before calling the tool the
run asks the journal for an output indexed under that key no older than the policy's ttl
(:meth:`StepCache.lookup`); on a hit the step succeeds with that output and ``cache: {run, step, at}``, the tool
is not called. A miss runs the tool, and its ``step_succeeded`` carries ``cache_key``, which the journal indexes in
the same transaction. docs/caching.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from planweave.core.events import CacheHitData
from planweave.core.plan.cache import FOREVER, CachePolicy, step_policy, tool_policy, tool_version
from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.core.plan.graph import Plan
from planweave.core.state import StepRecord
from planweave.journal.base import Journal, encode_blob, find_cached


def cache_key(tool: str, version: str, args: Mapping[str, Any]) -> str:
    """The key of a call: sha256 of the canonical JSON (sorted keys, ASCII) of tool name, version and arguments."""
    body = json.dumps({"tool": tool, "version": version, "args": args}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()


class CacheHit(NamedTuple):
    """An output served from the cache: its value, its blob reference and where it came from."""

    value: Any
    ref: str
    source: CacheHitData


class CacheEntry(NamedTuple):
    """A cacheable attempt: its key and policy."""

    key: str
    policy: CachePolicy


class StepCache:
    """One run's use of the result cache (built by the run; ``lookup=False`` is ``--no-cache``: outputs are still
    indexed, so a later run can reuse them, but none is reused)."""

    def __init__(self, journal: Journal, now: Callable[[], float], *, lookup: bool,
                 redact: Callable[[Any], Any] | None) -> None:
        self._journal = journal
        self._now = now
        self._lookup = lookup
        self._redact = redact
        self._plan: Plan | None = None
        self._policies: dict[tuple[str, str], CachePolicy | None] = {}

    @staticmethod
    def declared_in(tools: ToolCatalog) -> bool:
        """Whether a tool of ``tools`` declares ``cache``: if none does, only a step saying ``cache:`` can be cached,
        and the run asks nothing else of the cache (a step of such a run pays two attribute reads)."""
        return any(tool_policy(t) is not None for t in tools.values())

    def entry(self, plan: Plan, rec: StepRecord, tool: ToolSpec, args: Mapping[str, Any]) -> CacheEntry | None:
        """The key and policy of this attempt, or None when it may not be cached."""
        if plan is not self._plan:  # a new plan version: policies are per (step, tool) of a version
            self._plan = plan
            self._policies = {}
        sid = rec.id
        memo = (sid, tool.name)
        policy = self._policies.get(memo, ...)
        if policy is ...:
            policy = self._policies[memo] = step_policy(plan.steps[sid], tool, plan.spec)
        if policy is None:
            return None
        try:
            return CacheEntry(cache_key(tool.name, tool_version(tool), args), policy)
        except (TypeError, ValueError):  # arguments JSON cannot hold exactly: the tool refuses them, uncached
            return None

    def history_entry(self, tool: ToolSpec, args: Mapping[str, Any]) -> CacheEntry | None:
        """The key an idempotent attempt of a speculating run indexes its output under although its step is not
        cacheable: a later run's speculator may take it as a *prediction* (verified when the producer finishes,
        never reused as its output; docs/speculation.md)."""
        try:
            return CacheEntry(cache_key(tool.name, tool_version(tool), args), FOREVER)
        except (TypeError, ValueError):
            return None

    async def lookup(self, entry: CacheEntry) -> CacheHit | None:
        """The output to reuse for ``entry``, if the journal holds one young enough (and the cache is on)."""
        if not self._lookup:
            return None
        found = await find_cached(self._journal, entry.key, entry.policy.since(self._now()))
        if found is None:
            return None
        return CacheHit(found.value, found.output, {"run": found.run_id, "step": found.step, "at": found.at})

    def succeeded(self, entry: CacheEntry, attempt: int, ref: str, output: Any) -> dict[str, Any]:
        """The ``step_succeeded`` data of a cacheable attempt that ran: with ``cache_key``, unless the stored output
        is not the output itself (``redact`` rewrote it), which must then never be reused."""
        data: dict[str, Any] = {"attempt": attempt, "output": ref}
        if self._redact is None or encode_blob(output)[0] == ref:
            data["cache_key"] = entry.key
        return data
