"""The planning benchmark counts model calls and tokens per goal and system, so extra round trips show."""

from __future__ import annotations

from planweave.bench.planning import make_goals, measure, model_calls_table


async def test_the_planning_benchmark_counts_model_calls_per_goal_and_system() -> None:
    goals = make_goals(1, seed=3, fail_rate=0.0, mean_ms=2)  # nothing fails: plan + answer, nothing else
    data = await measure(goals, ttft=0.0, tps=5000.0)
    steps = data["goals"][0]["steps"]
    calls = data["model_calls"]
    assert calls == {"streaming": [2], "whole_plan": [2], "synchronous": [2], "global_replan": [2],
                     "react": [steps + 1]}
    assert all(t[0] > 0 for t in data["model_tokens"].values())
    table = model_calls_table(data)
    assert f"{steps + 1} / {data['model_tokens']['react'][0]}" in table and "total" in table


async def test_a_flaky_step_costs_one_repair_call_per_failure_batch() -> None:
    goals = make_goals(1, seed=3, fail_rate=0.3, mean_ms=2)
    n_flaky = sum(1 for s in goals[0].steps if s["args"].get("flaky"))
    assert n_flaky > 0, "the seed must give a flaky step"
    data = await measure(goals, ttft=0.0, tps=5000.0)
    for system in ("streaming", "whole_plan", "synchronous", "global_replan"):
        (count,) = data["model_calls"][system]
        assert 3 <= count <= 2 + n_flaky, (system, count)  # plan, one repair per batch of failures, answer
