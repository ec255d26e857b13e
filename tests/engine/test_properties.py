"""Properties of every run (hypothesis): it terminates, no finished step runs twice, capacities hold."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Toolbox, builtin_tools
from planweave.engine.scheduler import Scheduler
from tests.engine.conftest import run_plan


@st.composite
def plans(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, int], int | None]:
    n = draw(st.integers(1, 25))
    caps = {"cpu": draw(st.integers(1, 3)), "io": draw(st.integers(1, 2))}
    steps = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        claims = {}
        if draw(st.booleans()):
            claims["cpu"] = draw(st.integers(1, caps["cpu"]))
        if draw(st.booleans()):
            claims["io"] = draw(st.integers(1, caps["io"]))
        steps.append({
            "id": f"s{i}",
            "tool": "probe",
            "args": {"name": f"s{i}", "seconds": draw(st.sampled_from([0, 0.5, 1, 2.5])),
                     "fail": draw(st.integers(0, 3))},
            "after": [f"s{p}" for p in parents],
            "resources": claims,
            "retries": draw(st.integers(0, 2)),
            "estimate": {"duration": draw(st.integers(0, 5))},
        })
    concurrency = draw(st.one_of(st.none(), st.integers(1, 4)))
    return {"steps": steps}, caps, concurrency


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_runs_terminate_never_rerun_successes_and_respect_capacities(
    case: tuple[dict[str, Any], dict[str, int], int | None],
) -> None:
    doc, caps, concurrency = case
    in_use = {"cpu": 0, "io": 0}
    running = [0]
    succeeded: list[str] = []
    attempts: dict[str, int] = {}
    claims = {s["id"]: s["resources"] for s in doc["steps"]}
    box: Toolbox = builtin_tools()

    async def probe(name: str, seconds: float, fail: int) -> str:
        attempts[name] = attempts.get(name, 0) + 1
        running[0] += 1
        for r, a in claims[name].items():
            in_use[r] += a
            assert in_use[r] <= caps[r], f"capacity of {r} exceeded"
        assert concurrency is None or running[0] <= concurrency
        try:
            await asyncio.sleep(seconds)
        finally:
            running[0] -= 1
            for r, a in claims[name].items():
                in_use[r] -= a
        if attempts[name] <= fail:
            raise RuntimeError("planned failure")
        assert name not in succeeded, f"{name} ran again after it succeeded"
        succeeded.append(name)
        return name

    box.add(probe)
    result = run_plan(doc, box, concurrency=concurrency, capacities=caps)
    steps = result.summary["steps"]
    assert result.status in ("succeeded", "failed")
    assert all(s["status"] in ("succeeded", "failed", "skipped") for s in steps.values())
    assert sorted(succeeded) == sorted(k for k, s in steps.items() if s["status"] == "succeeded")
    for k, s in steps.items():
        assert s["attempts"] == attempts.get(k, 0)
    assert (result.status == "succeeded") == all(s["status"] == "succeeded" for s in steps.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.floats(0, 10)), min_size=1, max_size=40),
       st.integers(1, 5))
def test_scheduler_never_exceeds_capacity_and_admits_everything(
    items: list[tuple[int, int, float]], concurrency: int
) -> None:
    sched: Scheduler[int] = Scheduler(concurrency, {"a": 3, "b": 2})
    for i, (a, b, rank) in enumerate(items):
        claims = {k: v for k, v in (("a", a), ("b", b)) if v}
        sched.push(i, rank=rank, ready_at=0.0, claims=claims)
    done = 0
    running: list[tuple[int, Any]] = []
    while done < len(items):
        admitted = sched.admit()
        running.extend(admitted)
        assert sched.running <= concurrency
        assert sched.in_use["a"] <= 3 and sched.in_use["b"] <= 2
        assert running, "nothing admitted although nothing runs: a starvation or a leak"
        _, claims = running.pop(0)
        sched.release(claims)
        done += 1
    assert len(sched) == 0 and sched.running == 0 and sched.in_use == {"a": 0, "b": 0}


def test_big_claim_is_not_starved_by_small_ones() -> None:
    sched: Scheduler[str] = Scheduler(None, {"gpu": 2})
    sched.push("small0", rank=10, ready_at=0, claims={"gpu": 1})
    assert [i for i, _ in sched.admit()] == ["small0"]
    sched.push("big", rank=5, ready_at=0, claims={"gpu": 2})
    sched.push("small1", rank=1, ready_at=1, claims={"gpu": 1})
    sched.push("free", rank=0, ready_at=1)
    # 'big' waits for the gpu; 'small1' would take the free gpu ahead of it, so it must wait too.
    assert [i for i, _ in sched.admit()] == ["free"]
    sched.release({"gpu": 1})
    assert [i for i, _ in sched.admit()] == ["big"]
