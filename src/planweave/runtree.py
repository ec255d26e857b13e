"""The tree of a goal run's sub-plans as the journal holds it: which runs are children, and a run's children.

A child run (planning/subplans.py) is journaled like any run, with its parent named in ``run_created``
(``options.limits.parent``: run, step, depth) and an id ``<parent>.<step>`` (``-N`` for a later attempt). This is
the one read model of that tree for both edges: ``planweave runs`` (roots only unless ``--all``), ``planweave show``
(the children, indented) and the server's run page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.journal.base import Journal

__all__ = ["ANSWER_CHARS", "child_ids", "parent_link", "run_tree"]

ANSWER_CHARS = 120


def parent_link(events: Sequence[Event]) -> Mapping[str, Any] | None:
    """The parent link (``run``, ``step``, ``depth``) a child run journaled in ``run_created``, or None for a root."""
    for event in events:
        if event.kind == "run_created":
            limits = (event.data.get("options") or {}).get("limits") or {}
            parent = limits.get("parent") if isinstance(limits, Mapping) else None
            return parent if isinstance(parent, Mapping) else None
    return None


async def child_ids(journal: Journal, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` are child runs (their ``run_created`` names a parent). Only ids with a dot can be: just
    their first event is read, so a page of ``runs`` costs the runs shown, however big the journal is."""
    found = set()
    for rid in ids:
        if "." in rid and parent_link(await journal.read(rid, kind="run_created")) is not None:
            found.add(rid)
    return found


def _cut(text: str | None) -> str | None:
    if not text:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= ANSWER_CHARS else flat[: ANSWER_CHARS - 1] + "…"


async def run_tree(journal: Journal, run_id: str, *,
                   status_of: Callable[[RunState, Sequence[Event]], str] | None = None) -> list[dict[str, Any]]:
    """The children of ``run_id``, each ``{run, step, depth, status, answer, error, children}`` (``answer`` cut to
    :data:`ANSWER_CHARS`), their own children nested, in the order they were started. ``status_of`` is the status
    shown for a child (e.g. ``interrupted`` for a running one whose process is gone; default: the journaled one)."""
    known = set(await journal.run_ids())
    return await _children(journal, run_id, known, status_of)


async def _children(journal: Journal, run_id: str, known: set[str],
                    status_of: Callable[[RunState, Sequence[Event]], str] | None) -> list[dict[str, Any]]:
    out: list[tuple[float, dict[str, Any]]] = []
    for rid in sorted(r for r in known if r.startswith(run_id + ".") and "." not in r[len(run_id) + 1:]):
        events = await journal.read(rid)
        link = parent_link(events)
        if link is None or link.get("run") != run_id:
            continue
        state = RunState.from_events(rid, events)
        out.append((events[0].at, {
            "run": rid, "step": link.get("step"), "depth": link.get("depth"),
            "status": state.status if status_of is None else status_of(state, events),
            "answer": _cut(state.answer), "error": _cut(state.error),
            "children": await _children(journal, rid, known, status_of),
        }))
    return [child for _, child in sorted(out, key=lambda item: item[0])]
