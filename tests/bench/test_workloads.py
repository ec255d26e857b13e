"""Benchmark workloads are seeded DAGs of the promised shape, and every system runs them to the critical path."""

from __future__ import annotations

import asyncio
import json

import pytest

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.bench import engine as bench_engine
from planweave.bench.peers import SleepRecorder, run_floor, run_journaled_floor
from planweave.bench.workloads import (
    Workload,
    critical_path,
    fan_out,
    latency_random,
    layered,
    plan_document,
    uneven,
)
from planweave.core.plan.graph import parse_plan_document, validate_plan


def _layers(workload: Workload) -> dict[str, int]:
    level: dict[str, int] = {}
    for sid, parents in workload.deps.items():
        level[sid] = 1 + max((level[p] for p in parents), default=-1)
    return level


def test_fan_out_has_one_source_one_sink_and_the_rest_in_parallel() -> None:
    w = fan_out(1000)

    assert len(w) == 1000
    assert w.deps["src"] == ()
    assert len(w.deps["sink"]) == 998
    assert w.sinks == ("sink",)
    assert w.depth == 3
    assert w.durations == {}


def test_layered_dag_has_20_layers_of_1_to_3_parents_from_the_previous_layer() -> None:
    w = layered(1000)
    level = _layers(w)

    assert len(w) == 1000
    assert w.depth == 20
    assert sum(1 for lv in level.values() if lv == 0) == 50
    for sid, parents in w.deps.items():
        if level[sid] > 0:
            assert 1 <= len(parents) <= 3
            assert all(level[p] == level[sid] - 1 for p in parents)
            assert len(set(parents)) == len(parents)


def test_generators_are_seeded() -> None:
    assert layered(500, seed=7) == layered(500, seed=7)
    assert layered(500, seed=7) != layered(500, seed=8)
    assert latency_random(seed=4) == latency_random(seed=4)


def test_latency_random_dag_sleeps_around_50_ms_and_is_topologically_ordered() -> None:
    w = latency_random(200)
    seen: set[str] = set()
    for sid, parents in w.deps.items():
        assert set(parents) <= seen
        seen.add(sid)
    durations = sorted(w.durations.values())

    assert len(w) == 200
    assert 0.035 < durations[100] < 0.07  # the median
    assert all(0 < d <= 0.5 for d in durations)
    assert 10 < w.depth < len(w)


def test_uneven_slow_steps_are_leaves_so_the_critical_path_skips_them_but_the_last() -> None:
    w = uneven(layers=20, fast_per_layer=9)
    slow = [sid for sid, d in w.durations.items() if d == 0.5]
    parents = {p for ps in w.deps.values() for p in ps}

    assert len(w) == 200
    assert len(slow) == 20
    assert not parents & set(slow)
    assert w.critical_path == pytest.approx(19 * 0.01 + 0.5)


def test_critical_path_is_the_longest_weighted_path() -> None:
    deps = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}

    assert critical_path(deps, {"a": 1, "b": 5, "c": 2, "d": 1}) == 7
    assert critical_path(deps, {}) == 0


def test_plan_documents_validate_and_carry_the_durations_as_estimates() -> None:
    w = uneven(layers=6)
    plan = validate_plan(parse_plan_document(plan_document(w)), builtin_tools())

    assert len(plan) == len(w)
    assert plan.makespan_lower_bound == pytest.approx(w.critical_path)
    assert {s.tool for s in plan.steps.values()} == {"sleep"}
    assert {s.tool for s in parse_plan_document(plan_document(fan_out(10))).steps} == {"noop"}


@pytest.mark.parametrize("workload", [latency_random(60), uneven(layers=8)], ids=lambda w: w.name)
def test_planweave_and_the_floor_finish_at_the_critical_path_on_the_virtual_clock(workload: Workload) -> None:
    async def floor() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await run_floor(workload.deps, SleepRecorder(workload.durations))
        return float(loop.time() - start)

    async def planweave() -> float:
        async with open_engine("null://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await engine.start(parse_plan_document(plan_document(workload)))
            result = await run.wait()
        assert result.ok
        return float(result.summary["makespan_s"])

    assert run_virtual(floor()) == pytest.approx(workload.critical_path)
    assert run_virtual(planweave()) == pytest.approx(workload.critical_path)


def test_the_floor_runs_every_step_once_after_its_parents() -> None:
    w = layered(200)
    order: list[str] = []

    async def work(sid: str) -> None:
        order.append(sid)

    run_virtual(run_floor(w.deps, work))

    assert sorted(order) == sorted(w.deps)
    position = {sid: i for i, sid in enumerate(order)}
    assert all(position[p] < position[sid] for sid, parents in w.deps.items() for p in parents)


def test_the_journaled_floor_runs_every_step_once_and_journals_its_start_before_its_end() -> None:
    w = layered(200)
    order: list[str] = []

    async def work(sid: str) -> None:
        order.append(sid)

    log = run_virtual(run_journaled_floor(w.deps, work))

    position = {sid: i for i, sid in enumerate(order)}
    assert sorted(order) == sorted(w.deps)
    assert all(position[p] < position[sid] for sid, parents in w.deps.items() for p in parents)
    kinds: dict[str, list[str]] = {}
    for event in log:
        kinds.setdefault(event[3], []).append(event[1])
    assert kinds == {sid: ["step_started", "step_succeeded"] for sid in w.deps}


def test_sleep_recorder_records_every_step() -> None:
    w = uneven(layers=3)
    recorder = SleepRecorder(w.durations)

    run_virtual(run_floor(w.deps, recorder))

    assert recorder.actual.keys() == w.durations.keys()


def test_engine_benchmark_smoke_run_prints_json_for_the_selected_systems(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_engine.main(["--quick", "--sizes", "40", "--systems", "pw-null,pw-memory,floor",
                              "--sections", "overhead", "--json"])
    results = json.loads(capsys.readouterr().out)

    assert code == 0
    assert set(results["systems"]) == {"pw-null", "pw-memory", "floor"}
    for name in ("fan-out 40", "layered 40"):
        for key in ("pw-null", "pw-memory", "floor"):
            assert results["overhead"][name]["results"][key]["us_per_step"] > 0
    assert [t["target"] for t in results["targets"]] == ["null <= 2x floor", "null <= 2x floor"]


def test_engine_benchmark_table_shows_skipped_systems(capsys: pytest.CaptureFixture[str]) -> None:
    results = {
        "date": "2026-01-01T00:00:00+00:00",
        "planweave": "0.1.0",
        "machine": {"cpus": 2, "cpu": "test", "python": "3.11", "platform": "Linux"},
        "settings": {"repeats": 3, "latency_repeats": 2, "budget_s": 30.0},
        "systems": {
            "pw-null": {"label": "planweave null://", "status": "measured", "peak_rss_mb": 50.0},
            "ray": {"label": "Ray (local)", "status": "skipped: not installed (ray); pip install -e .[bench]"},
        },
        "overhead": {"fan-out 1,000": {"steps": 1000, "results": {"pw-null": {"us_per_step": 12.5, "note": ""}}}},
        "latency": {},
        "journal_throughput": {},
        "targets": [],
    }
    table = bench_engine.render_table(results)

    assert "| fan-out 1,000: us/step" in table
    assert "12.5 |" in table
    assert "skipped |" in table
    assert "Ray (local): skipped: not installed" in table


def test_engine_benchmark_rejects_sizes_too_small_for_20_layers() -> None:
    with pytest.raises(SystemExit):
        bench_engine.parse_args(["--sizes", "10"])
