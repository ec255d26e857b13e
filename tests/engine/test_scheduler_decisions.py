"""Scheduler contracts that mutation testing found unchecked: claims refused at push, discard's count and order."""

from __future__ import annotations

import pytest

from planweave.core.plan.model import Claim
from planweave.core.scheduler import CapacityExceeded, Scheduler


def test_a_claim_on_an_unknown_capacity_is_refused_naming_it() -> None:
    sched: Scheduler[str] = Scheduler(None, {"gpu": 2})
    with pytest.raises(CapacityExceeded, match=r"^claim on 'tpu', which has no capacity$"):
        sched.push("a", rank=0, ready_at=0, claim=Claim({"tpu": 1}))
    assert len(sched) == 0


def test_a_claim_larger_than_its_capacity_is_refused_naming_both() -> None:
    sched: Scheduler[str] = Scheduler(None, {"gpu": 2})
    with pytest.raises(CapacityExceeded, match=r"^claim of 3 on 'gpu' exceeds its capacity 2$"):
        sched.push("a", rank=0, ready_at=0, claim=Claim({"gpu": 3}))
    sched.push("b", rank=0, ready_at=0, claim=Claim({"gpu": 2}))  # exactly the capacity fits
    assert len(sched) == 1


def test_discard_drops_what_keep_refuses_and_says_how_many() -> None:
    sched: Scheduler[str] = Scheduler(None, {})
    for rank, item in enumerate(["x1", "k1", "x2", "k2"]):
        sched.push(item, rank=rank, ready_at=0)
    assert sched.discard(lambda item: item.startswith("k")) == 2
    assert len(sched) == 2
    assert [i for i, _ in sched.admit()] == ["k2", "k1"]  # the survivors keep their priority order
    assert sched.discard(lambda item: True) == 0
