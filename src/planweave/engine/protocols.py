"""Protocols the engine checks objects against at run time (``isinstance``).

They live apart from :mod:`planweave.engine.runtime` because that module may be compiled (mypyc, see setup.py),
which turns a class into a native one: a ``runtime_checkable`` Protocol must stay an interpreted class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from planweave.core.events import Event


@runtime_checkable
class PlanSeal(Protocol):
    """A ``redact`` that also keeps secrets out of the plans the journal keeps
    (:class:`planweave.tools.safety.SecretRedactor`)."""

    def __call__(self, value: Any) -> Any: ...

    def seal(self, event: Event) -> Event:
        """``event`` (``run_created``, ``plan_version`` or ``steps_added``) as it may be journaled."""
        ...

    def unseal(self, events: Sequence[Event]) -> list[Event]:
        """Journaled events with the plans' secrets put back (raises RunError naming what is missing)."""
        ...


@runtime_checkable
class Closable(Protocol):
    """Something the engine owns and closes with itself: a tool catalog holding resources (a
    :class:`~planweave.tools.Toolbox`: its http.* connection pool) or an executor (a worker thread)."""

    async def aclose(self) -> None: ...
