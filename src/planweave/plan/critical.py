"""Critical-path analysis: upward ranks by estimated duration and the makespan lower bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def upward_ranks(
    order: Sequence[str], dependents: Mapping[str, Sequence[str]], duration: Mapping[str, float]
) -> dict[str, float]:
    """Return, per step, its duration plus the longest chain of durations below it.

    ``order`` must be topological (parents before children).
    """
    rank: dict[str, float] = {}
    for step in reversed(order):
        below = max((rank[c] for c in dependents.get(step, ())), default=0.0)
        rank[step] = duration[step] + below
    return rank


def critical_path(
    order: Sequence[str],
    deps: Mapping[str, Sequence[str]],
    dependents: Mapping[str, Sequence[str]],
    rank: Mapping[str, float],
) -> tuple[float, list[str]]:
    """Return the makespan lower bound (unlimited parallelism) and one path attaining it, given upward ranks."""
    roots = [s for s in order if not deps.get(s)]
    if not roots:
        return 0.0, []
    step = max(roots, key=lambda s: rank[s])
    path = [step]
    while dependents.get(step):
        step = max(dependents[step], key=lambda s: rank[s])
        path.append(step)
    return rank[path[0]], path
