"""Tests of stats.py: ``pytest -q`` in this folder."""

from __future__ import annotations

import pytest
from stats import mean, median


def test_mean() -> None:
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_of_an_odd_count_is_the_middle_value() -> None:
    assert median([3, 1, 2]) == 2


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values() -> None:
    assert median([4, 1, 3, 2]) == 2.5


def test_no_values_are_refused() -> None:
    with pytest.raises(ValueError):
        median([])
