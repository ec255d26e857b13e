"""The scheduler's public fast path (``try_start_now``, ``has_waiting``, ``adopt``), driven directly (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planweave.core.plan.model import Claim
from planweave.core.scheduler import Scheduler

# An operation: ("push", claims cpu), ("now", claims cpu, batch), ("admit",), ("release",)
operations = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 2)),
    st.tuples(st.just("now"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("admit")),
    st.tuples(st.just("release")),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(operations, st.one_of(st.none(), st.integers(1, 4)))
def test_try_start_now_starts_only_what_nothing_could_order(ops: list[tuple[Any, ...]],
                                                            concurrency: int | None) -> None:
    sched: Scheduler[int] = Scheduler(concurrency, {"cpu": 2})
    held: list[Claim | None] = []  # what holds a slot now, in start order
    for n, op in enumerate(ops):
        before = (sched.running, len(sched), dict(sched.in_use))
        if op[0] == "push":
            sched.push(n, rank=0.0, ready_at=float(n), claim=Claim({"cpu": op[1]}) if op[1] else None)
        elif op[0] == "now":
            claim = Claim({"cpu": 1}) if op[1] else None
            batch = op[2]
            expected = claim is None and len(sched) == 0 and (concurrency is None or sched.running + batch
                                                               <= concurrency)
            started = sched.try_start_now(claim, batch)
            assert started == expected
            if started:
                held.append(None)
                assert (sched.running, len(sched), sched.in_use) == (before[0] + 1, before[1], before[2])
            else:
                assert (sched.running, len(sched), sched.in_use) == before  # a refusal changes nothing
        elif op[0] == "admit":
            held.extend(claim for _, claim in sched.admit())
        elif held:
            sched.release(held.pop(0))
        assert sched.has_waiting == (len(sched) > 0)
        assert sched.running == len(held)
        assert concurrency is None or sched.running <= concurrency
        assert 0 <= sched.in_use["cpu"] <= 2


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from("abc"), st.integers(1, 5)),
       st.dictionaries(st.sampled_from("abcd"), st.integers(1, 5)))
def test_adopt_adds_unknown_capacities_and_keeps_known_ones(known: dict[str, int], declared: dict[str, int]) -> None:
    sched: Scheduler[int] = Scheduler(None, known)
    if known:
        name = sorted(known)[0]
        sched.push(0, rank=0.0, ready_at=0.0, claim=Claim({name: 1}))
        sched.admit()
    in_use = dict(sched.in_use)
    sched.adopt(declared)
    assert sched.capacities == {**declared, **known}
    assert sched.in_use == {name: in_use.get(name, 0) for name in sched.capacities}
