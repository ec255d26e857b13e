"""``planweave bench allocate``'s claim as an ordering (issue 27, part 4): the Monte Carlo allocator completes more
runs within budget and deadline than the greedy baseline.

A small cell that the full table shows the gap in (ProofFlow at 2x budget and 2x deadline, 10 paired runs, 50
simulations per decision): the runs are on the virtual clock and the synthetic model's luck is keyed by run, step,
attempt, model and sample, so the same seed replays the same counts. The fractions stay in docs/benchmarks.md.
"""

from __future__ import annotations

from planweave.bench.allocate import run_bench


def test_monte_carlo_completes_more_runs_than_greedy_under_a_moderate_budget_and_deadline() -> None:
    out = run_bench(runs=10, shapes=["proofflow"], policies=["greedy", "monte_carlo"], sims=50,
                    settings=[("moderate", 2.0, 2.0)], seed=0)
    completed = {c["policy"]: c["completed"] for c in out["cells"]}
    assert completed["monte_carlo"] > completed["greedy"], completed
