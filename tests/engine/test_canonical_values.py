"""A step's output is normalised once, when it is stored: downstream steps see the same values live and resumed.

The journal's canonical form (tuples as lists, keys as strings, integers of any size exactly) is the only form;
NaN, ±Infinity and outputs above the engine's size limit fail the step with kind ``output``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Engine, Event, RunResult, builtin_tools, open_engine
from planweave.journal import open_journal
from planweave.tools.registry import Toolbox

PLAN = {"steps": [
    {"id": "a", "tool": "emit"},
    {"id": "gate", "tool": "gate", "after": ["a"]},
    {"id": "b", "tool": "take", "args": {"value": "${a}"}, "after": ["gate"]},
]}


class Harness:
    """Tools for PLAN: ``emit`` returns the value under test, ``gate`` can hold the run, ``take`` records its input."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.received: list[Any] = []
        self.hold = False

    def toolbox(self) -> Toolbox:
        box = builtin_tools()
        harness = self

        async def emit() -> Any:
            """Return the value under test, as the tool made it."""
            return harness.value

        async def gate() -> None:
            """Wait forever while the harness holds the run (the run is then interrupted)."""
            if harness.hold:
                await asyncio.Event().wait()

        async def take(value: Any) -> None:
            """Record what the step received."""
            harness.received.append(value)

        box.add(emit, idempotent=True)
        box.add(gate, idempotent=True)
        box.add(take, idempotent=True)
        return box


async def _live(url: str, harness: Harness, run_id: str, **engine: Any) -> RunResult:
    async with open_journal(url) as journal, Engine(journal, tools=harness.toolbox(), **engine) as eng:
        return await (await eng.start(PLAN, run_id=run_id)).wait()


async def _interrupted_then_resumed(url: str, harness: Harness, run_id: str) -> RunResult:
    """Run until ``a`` succeeded and ``gate`` holds, close the engine (interrupting the run), resume in a new one."""
    harness.hold = True
    async with open_engine(url, tools=harness.toolbox()) as eng:
        gated: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_event(event: Event) -> None:
            # run_finished too: a run that failed before the gate must fail the test, not hang it
            if event.kind in ("step_started", "run_finished") and event.step in ("gate", None) and not gated.done():
                gated.set_result(None)

        await eng.start(PLAN, run_id=run_id, on_event=on_event)
        await asyncio.wait_for(gated, 20)
        await eng.journal.flush()
    harness.hold = False
    async with open_engine(url, tools=harness.toolbox()) as eng:
        return await (await eng.resume(run_id)).wait()


def _both(value: Any, tmp: Path) -> tuple[Harness, RunResult, Harness, RunResult]:
    url = f"sqlite:///{tmp / 'runs.db'}"
    live, resumed = Harness(value), Harness(value)
    live_result = asyncio.run(_live(url, live, "live"))
    resumed_result = asyncio.run(_interrupted_then_resumed(url, resumed, "resumed"))
    return live, live_result, resumed, resumed_result


# -- the property -------------------------------------------------------------------------------------------------
_scalars: st.SearchStrategy[Any] = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**200)
    | st.integers(min_value=-(2**200), max_value=-(2**63) + 2)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
)
_keys = st.text(max_size=4, alphabet="ab1_ ") | st.integers(min_value=-5, max_value=5) | st.integers(min_value=2**64)
_outputs = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_outputs)
def test_downstream_inputs_are_the_same_live_and_after_a_resume(value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live, live_result, resumed, resumed_result = _both(value, Path(tmp))
    assert live_result.status == resumed_result.status == "succeeded", (live_result.error, resumed_result.error)
    assert resumed.received == live.received
    assert len(live.received) == 1
    assert _same(live.received[0], resumed.received[0])
    # Run.outputs holds the canonical value too: what a reader of the journal gets.
    assert _same(live_result.outputs["a"], resumed_result.outputs["a"])


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (``==`` alone says 1 == 1.0 and (3, 4) != [3, 4])."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# -- the cases of issue 9 §2 --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ({1: "one"}, {"1": "one"}),
    ((3, 4), [3, 4]),
    (2**70, 2**70),
    ({"f": [1, (2**100, -(2**65))]}, {"f": [1, [2**100, -(2**65)]]}),
])
def test_live_values_are_already_in_the_journals_form(tmp_path: Path, value: Any, expected: Any) -> None:
    live, live_result, resumed, resumed_result = _both(value, tmp_path)
    assert live_result.ok and resumed_result.ok
    assert _same(live.received[0], expected)
    assert _same(resumed.received[0], expected)
    assert _same(live_result.outputs["a"], expected)


def test_a_reference_into_a_tuple_output_resolves(tmp_path: Path) -> None:
    plan = {"steps": [{"id": "a", "tool": "emit"}, {"id": "b", "tool": "take", "args": {"value": "${a[0]}"}}]}
    harness = Harness((3, 4))

    async def go() -> RunResult:
        async with open_engine(f"sqlite:///{tmp_path / 'runs.db'}", tools=harness.toolbox()) as eng:
            return await (await eng.start(plan)).wait()

    result = asyncio.run(go())
    assert result.ok, result.error
    assert harness.received == [3]


@pytest.mark.parametrize(("value", "message"), [
    ([1, 2, {"x": float("nan")}], "output of step 'a' at [2].x is NaN: not representable in JSON"),
    ({"big": 2**70, "y": float("inf")}, "output of step 'a' at y is Infinity: not representable in JSON"),
    (float("-inf"), "output of step 'a' is -Infinity: not representable in JSON"),
])
def test_non_finite_floats_fail_the_step_naming_the_place(tmp_path: Path, value: Any, message: str) -> None:
    harness = Harness(value)
    result = asyncio.run(_live(f"sqlite:///{tmp_path / 'runs.db'}", harness, "nan"))
    assert result.status == "failed"
    failed = _failures(tmp_path, "a")
    assert failed == [("output", message)]
    assert harness.received == []
    assert _count(tmp_path, "blobs") == 0


# -- the output size limit (issue 8 #10) --------------------------------------------------------------------------
def test_an_output_above_the_engines_limit_fails_with_kind_output_and_nothing_is_stored(tmp_path: Path) -> None:
    harness = Harness("x" * 5000)
    result = asyncio.run(_live(f"sqlite:///{tmp_path / 'runs.db'}", harness, "big", max_output_bytes=4096))
    assert result.status == "failed"
    assert _failures(tmp_path, "a") == [
        ("output", "output of step 'a' is 5,002 bytes encoded, more than the limit of 4,096 bytes")]
    assert _count(tmp_path, "blobs") == 0
    assert harness.received == []


def test_the_default_limit_is_16_mib(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    fits = Harness("y" * (16 * 1024 * 1024 - 2))  # with its quotes: exactly 16 MiB
    assert asyncio.run(_live(url, fits, "fits")).ok
    too_big = Harness("z" * (16 * 1024 * 1024 - 1))
    assert asyncio.run(_live(url, too_big, "too-big")).status == "failed"
    assert _failures(tmp_path, "a", "too-big") == [
        ("output", "output of step 'a' is 16,777,217 bytes encoded, more than the limit of 16,777,216 bytes")]
    assert _count(tmp_path, "blobs") == 2  # the one that fits, and b's None: not the one above the limit


def _failures(tmp: Path, step: str, run_id: str | None = None) -> list[tuple[str, str]]:
    import json

    conn = sqlite3.connect(tmp / "runs.db")
    try:
        query = "SELECT run_id, data FROM events WHERE kind = 'step_failed' AND step = ?"
        rows = conn.execute(query, (step,)).fetchall()
    finally:
        conn.close()
    return [(d["kind"], d["error"]) for r, d in ((r, json.loads(d)) for r, d in rows) if run_id in (None, r)]


def _count(tmp: Path, table: str) -> int:
    conn = sqlite3.connect(tmp / "runs.db")
    try:
        ((n,),) = conn.execute(f"SELECT count(*) FROM {table}").fetchall()
    finally:
        conn.close()
    return int(n)
