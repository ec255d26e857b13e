"""``planweave bench ray`` measures every system on the cluster (figures are printed, never asserted)."""

from __future__ import annotations

import asyncio

from planweave.bench.ray_steps import Settings, measure, render


def test_the_ray_benchmark_measures_every_system_and_renders_ratios(ray_address: str) -> None:
    import ray

    settings = Settings(chain=3, fan_out=4, cpu_steps=2, cpu_loops=1000, latency=False)  # latency DAGs: slow
    results = asyncio.run(measure(settings, ray, lambda _: None))
    results.update(ray=ray.__version__, cpus=2)
    assert [row["workload"] for row in results["overhead"]] == ["chain 3", "fan-out 4"]
    assert set(results["overhead"][0]["per_step_ms"]) == {"Ray task", "Ray streaming task", "planweave on Ray",
                                                          "planweave in-process"}
    assert set(results["cpu"][0]["makespan_s"]) == {"Ray tasks", "planweave on Ray", "planweave in-process (threads)"}
    table = render(results)
    assert "chain 3" in table and "fan-out 4" in table and "against in-process threads" in table
