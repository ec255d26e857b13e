"""Small statistics helpers (the project the coding agent of examples/coding_agent.py repairs)."""

from __future__ import annotations


def mean(values: list[float]) -> float:
    """The arithmetic mean of ``values``; raises ValueError for no values."""
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """The middle value of ``values`` once sorted (the mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle]
