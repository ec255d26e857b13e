"""``planweave bench memory``: memory on saves steps on a family of related goals; precision@k is measured."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planweave.bench.memory import precision_at_k, run_bench
from planweave.cli.main import app


def test_memory_on_runs_the_short_plan_after_the_first_goal_and_reports_precision() -> None:
    result = run_bench(3, seed=1)
    assert result["off"]["steps_per_goal"] == 9.0
    first, *rest = result["per_goal"]
    assert first["recalled"] == [] and all(r["recalled"] for r in rest)  # learnt once, then recalled
    assert all(r["steps_on"] == 2 for r in rest) and first["steps_on"] > first["steps_off"]  # verification costs
    assert result["on"]["steps_per_goal"] < result["off"]["steps_per_goal"]
    retrieval = result["retrieval"]
    assert 0 < retrieval["precision_at_3"] <= retrieval["precision_at_1"] <= 1


def test_precision_at_k() -> None:
    assert precision_at_k([1, 2, 3], {1, 3}, 1) == 1.0
    assert precision_at_k([1, 2, 3], {1, 3}, 3) == 2 / 3
    assert precision_at_k([2], {1}, 3) == 0.0


def test_bench_memory_json_from_the_cli() -> None:
    out = CliRunner().invoke(app, ["bench", "memory", "--goals", "2", "--json"])
    assert out.exit_code == 0, out.output
    assert set(json.loads(out.stdout)) >= {"off", "on", "per_goal", "retrieval"}
