"""Budget slices of sub-plans are never overspent: a property over random slice sizes and child spend.

Children open at once (each reserving its slice from the parent's Budget before it starts), each spends through its
own Budget of its slice with calls that reserve their worst case and settle for less, then settle back into the
parent in any order — the protocol the ``plan`` tool follows (planning/subplans.py).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planweave.core.errors import ToolError
from planweave.models import Budget, BudgetExceeded
from planweave.planning.subplans import BudgetSlice, _reserve, _settle, slice_budget

child_plan = st.tuples(
    st.one_of(st.none(), st.integers(0, 5_000)),  # tokens the child asks for (None: a fair share)
    st.lists(st.tuples(st.integers(1, 3_000), st.floats(0.0, 1.0)), max_size=6),  # calls: worst case, share used
)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 20_000), children=st.lists(child_plan, max_size=6), order=st.randoms())
def test_children_never_spend_beyond_their_slice_nor_the_parent_beyond_its_budget(
        total: int, children: list[tuple[int | None, list[tuple[int, float]]]], order: object) -> None:
    parent = Budget(tokens=total)
    open_children = []
    for n, (asked, calls) in enumerate(children):
        share = slice_budget(None if asked is None else BudgetSlice(tokens=asked), parent.remaining_usd,
                             parent.remaining_tokens, len(children) - n)
        try:
            reservation = _reserve(parent, share, f"root.c{n}")
        except ToolError:  # the slice does not fit: the plan step fails, nothing is held
            continue
        own = Budget(tokens=share.tokens)
        open_children.append((share, own, reservation, calls))
    assert parent.remaining_tokens is not None and parent.remaining_tokens >= 0
    order.shuffle(open_children)  # type: ignore[attr-defined]
    spent = 0
    for share, own, reservation, calls in open_children:
        for worst, used in calls:
            try:
                held = own.reserve(0.0, worst)
            except BudgetExceeded:
                break
            own.settle(held, 0.0, int(worst * used))
        assert share.tokens is not None and own.spent_tokens <= share.tokens  # a child stays in its slice
        spent += own.spent_tokens
        _settle(parent, reservation, own.spent_usd, own.spent_tokens)
    assert parent.spent_tokens == spent <= total  # the children's spend, all of it, and never above the budget
    assert parent.reserved_tokens == 0


def test_a_fair_share_leaves_one_share_for_the_parent() -> None:
    assert slice_budget(None, 10.0, 1_000, 1) == BudgetSlice(5.0, 500)
    assert slice_budget(None, None, 900, 2) == BudgetSlice(None, 300)
    assert slice_budget(BudgetSlice(tokens=50), None, None, 1) == BudgetSlice(None, 50)
