"""``planweave bench speculate``'s claims as orderings on the virtual clock (issue 27, part 4): speculation changes no
result, and at a high hit rate it ends the run sooner than without it.

Two seeded DAGs of 12 ``llm`` steps, predictions right with p = 0 and 0.9, every mode; the scripted server's time
to first token and token pace are virtual time, so the figures are the same on every run. The timings stay in
docs/speculation.md and docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from planweave.bench.speculate import MODES, run_bench


@pytest.fixture(scope="module")
def rows() -> dict[tuple[float, str], dict[str, Any]]:
    result = run_bench(seeds=2, steps=12, accuracies=(0.0, 0.9), virtual=True)
    assert result["settings"]["clock"] == "virtual"
    return {(r["p"], r["mode"]): r for r in result["rows"]}


def test_no_result_differs_from_the_run_without_speculation(rows: dict[tuple[float, str], dict[str, Any]]) -> None:
    assert set(rows) == {(p, m) for p in (0.0, 0.9) for m in MODES}
    assert {k: r["results_differ"] for k, r in rows.items()} == {k: 0 for k in rows}


@pytest.mark.parametrize("mode", ["safe", "eager"])
def test_at_a_high_hit_rate_speculation_ends_the_run_sooner(rows: dict[tuple[float, str], dict[str, Any]],
                                                            mode: str) -> None:
    row = rows[(0.9, mode)]
    assert row["latency_s"] < rows[(0.9, "off")]["latency_s"] and row["vs_off"] < 1.0, row
    assert row["adopted"] > 0, row
