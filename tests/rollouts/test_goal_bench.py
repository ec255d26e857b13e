"""``planweave bench rollouts --goal`` runs sync and async modes on goal-run episodes and reports figures that add
up: every delivered trajectory's samples counted, tokens per second from the ids delivered, staleness within k."""

from __future__ import annotations

from planweave.bench.rollouts import main, render, run_goal_bench


def test_the_goal_bench_reports_trajectories_tokens_and_staleness_per_mode() -> None:
    result = run_goal_bench(batch=2, steps=2, train_s=0.01, call_s=0.0, cap=3, concurrency=4, staleness=(1,))
    assert set(result["async"]) == {"1"}
    for k, row in [("0", result["sync"]), *result["async"].items()]:
        assert row["trajectories"] == 4 and row["samples"] >= 4 * 3  # planner, one step or more, joiner
        assert row["tokens_per_s"] > 0 and row["tokens_per_s"] * row["seconds"] > row["samples"]
        assert row["max_staleness_seen"] <= int(k)
    assert "tokens/s" in render(result)


def test_bench_rollouts_goal_prints_one_json_object(capsys: object) -> None:
    import json

    assert main(["--goal", "--batch", "1", "--steps", "1", "--train-ms", "1", "--call-ms", "0", "--max-turns", "1",
                 "--concurrency", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert result["config"]["episodes"] == "goal runs" and set(result["async"]) == {"0", "1", "2"}
