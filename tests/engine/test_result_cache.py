"""The result cache: a cacheable step reuses the output of an earlier call with the same tool and arguments in the
journal (across runs and engines), within its ttl, and never where reuse could change a result."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import Engine, RunResult, Toolbox, VirtualClock, builtin_tools, run_virtual
from planweave.core.errors import PlanInvalid
from planweave.core.plan.graph import parse_plan_document
from planweave.engine.cache import cache_key
from planweave.journal import open_journal
from planweave.journal.memory import MemoryJournal
from planweave.tools.registry import tool
from tests.engine.conftest import JournalAt


@dataclass
class Pure:
    """Cacheable tools that count their real invocations (asserted after the runs, never inside a tool)."""

    calls: Counter[str] = field(default_factory=Counter)

    def toolbox(self, *, version: str = "") -> Toolbox:
        box = builtin_tools()
        pure = self

        async def square(x: int, seconds: float = 1.0) -> dict[str, int]:
            """x squared, slowly."""
            pure.calls[f"square({x})"] += 1
            await asyncio.sleep(seconds)
            return {"y": x * x}

        async def fresh(x: int) -> dict[str, int]:
            """x plus one; cacheable for 100 s."""
            pure.calls[f"fresh({x})"] += 1
            await asyncio.sleep(1)
            return {"y": x + 1}

        async def plain(x: int) -> dict[str, int]:
            """Idempotent, not declared cacheable."""
            pure.calls[f"plain({x})"] += 1
            return {"y": -x}

        async def effect(x: int) -> dict[str, int]:
            """Not idempotent."""
            pure.calls[f"effect({x})"] += 1
            return {"y": x}

        box.add(square, idempotent=True, cache=True, version=version)
        box.add(fresh, idempotent=True, cache={"ttl": 100})
        box.add(plain, idempotent=True)
        box.add(effect)
        return box


def plan(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"steps": list(steps), **extra}


SQUARES = plan({"id": "a", "tool": "square", "args": {"x": 3}},
               {"id": "b", "tool": "square", "args": {"x": "${a.y}"}})


def run_twice(journal_at: JournalAt, doc: dict[str, Any], pure: Pure, *, second: dict[str, Any] | None = None,
              cache: bool = True) -> tuple[RunResult, RunResult]:
    """``doc`` run in one engine, then ``second`` (default: ``doc`` again) in a new engine on the same journal."""

    async def once(d: dict[str, Any], run_id: str, use_cache: bool) -> RunResult:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=pure.toolbox(),
                                                          cache=use_cache) as engine:
            return await (await engine.start(d, run_id=run_id)).wait()

    first = run_virtual(once(doc, "first", True))
    return first, run_virtual(once(second or doc, "second", cache))


def test_a_second_run_reuses_the_outputs_without_calling_the_tool(journal_at: JournalAt) -> None:
    pure = Pure()
    first, second = run_twice(journal_at, SQUARES, pure)
    assert first.ok and second.ok
    assert second.outputs == first.outputs == {"a": {"y": 9}, "b": {"y": 81}}
    assert pure.calls == {"square(3)": 1, "square(9)": 1}  # the second run called nothing
    hits = {e.step: e.data for e in journal_at.events("second") if e.kind == "step_succeeded"}
    firsts = {e.step: e for e in journal_at.events("first") if e.kind == "step_succeeded"}
    for sid in ("a", "b"):
        assert hits[sid]["cache"] == {"run": "first", "step": sid, "at": firsts[sid].at}
        assert hits[sid]["output"] == firsts[sid].data["output"]
        assert "cache_key" in firsts[sid].data and "cache_key" not in hits[sid]


def test_different_arguments_or_another_tool_version_miss(journal_at: JournalAt) -> None:
    pure = Pure()
    other = plan({"id": "a", "tool": "square", "args": {"x": 4}})
    first, second = run_twice(journal_at, plan({"id": "a", "tool": "square", "args": {"x": 3}}), pure, second=other)
    assert (first.outputs, second.outputs) == ({"a": {"y": 9}}, {"a": {"y": 16}})
    assert pure.calls == {"square(3)": 1, "square(4)": 1}
    assert cache_key("square", "", {"x": 3}) != cache_key("square", "2", {"x": 3})
    assert cache_key("square", "", {"x": 3, "seconds": 1.0}) == cache_key("square", "", {"seconds": 1.0, "x": 3})


def test_a_new_tool_version_does_not_reuse_the_old_output() -> None:
    pure = Pure()

    async def go() -> list[RunResult]:
        journal = MemoryJournal()
        results = []
        for version in ("1", "1", "2"):
            async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox(version=version)) as engine:
                results.append(await (await engine.start(plan({"id": "a", "tool": "square", "args": {"x": 2}}))
                                       ).wait())
        return results

    results = run_virtual(go())
    assert all(r.ok for r in results) and pure.calls == {"square(2)": 2}  # version 1 once, version 2 once


def test_a_ttl_expires_on_the_virtual_clock() -> None:
    pure = Pure()

    async def go() -> list[str]:
        journal = MemoryJournal()
        served = []
        async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as engine:
            for wait, doc in ((0, plan({"id": "a", "tool": "fresh", "args": {"x": 1}})),  # produced at t=1
                              (98, plan({"id": "a", "tool": "fresh", "args": {"x": 1}})),  # t=99: 98 s old
                              (3, plan({"id": "a", "tool": "fresh", "args": {"x": 1}})),  # t=102: 101 s old
                              (0, plan({"id": "a", "tool": "square", "args": {"x": 1, "seconds": 0},
                                        "cache": {"ttl": 5}})),  # the step's own ttl: produced now
                              (4, plan({"id": "a", "tool": "square", "args": {"x": 1, "seconds": 0},
                                        "cache": {"ttl": 5}})),
                              (6, plan({"id": "a", "tool": "square", "args": {"x": 1, "seconds": 0},
                                        "cache": {"ttl": 5}}))):
                await asyncio.sleep(wait)
                run = await engine.start(doc)
                assert (await run.wait()).ok
                (done,) = [e for e in await journal.read(run.id) if e.kind == "step_succeeded"]
                served.append("hit" if "cache" in done.data else "miss")
        return served

    assert run_virtual(go()) == ["miss", "hit", "miss", "miss", "hit", "miss"]
    assert pure.calls == {"fresh(1)": 2, "square(1)": 2}


def test_no_cache_runs_every_step_and_still_records_its_outputs(journal_at: JournalAt) -> None:
    pure = Pure()
    first, second = run_twice(journal_at, SQUARES, pure, cache=False)
    assert first.outputs == second.outputs
    assert pure.calls == {"square(3)": 2, "square(9)": 2}
    done = [e for e in journal_at.events("second") if e.kind == "step_succeeded"]
    assert all("cache" not in e.data and "cache_key" in e.data for e in done)  # a later run may reuse them


@pytest.mark.parametrize("doc", [
    plan({"id": "a", "tool": "square", "args": {"x": 5}, "cache": False}),
    plan({"id": "a", "tool": "square", "args": {"x": 5}}, cache=False),
    plan({"id": "a", "tool": "square", "args": {"x": 5}, "reads": ["db"], "writes": ["out"]}),
    plan({"id": "a", "tool": "square", "args": {"x": 5}, "idempotent": False}),
    plan({"id": "a", "tool": "plain", "args": {"x": 5}}),  # idempotent, but its tool does not ask for the cache
], ids=["step-cache-false", "plan-cache-false", "writes", "step-not-idempotent", "tool-not-cacheable"])
def test_steps_that_may_not_be_cached_always_call_their_tool(doc: dict[str, Any]) -> None:
    pure = Pure()
    journal = JournalAt("memory://", MemoryJournal())
    run_twice(journal, doc, pure)
    assert list(pure.calls.values()) == [2]


def test_a_step_may_ask_for_the_cache_on_an_idempotent_tool_that_does_not_declare_it() -> None:
    pure = Pure()
    first, second = run_twice(JournalAt("memory://", MemoryJournal()),
                              plan({"id": "a", "tool": "plain", "args": {"x": 5}, "cache": True}), pure)
    assert first.outputs == second.outputs == {"a": {"y": -5}} and pure.calls == {"plain(5)": 1}


@pytest.mark.parametrize(("step", "message"), [
    ({"tool": "effect", "cache": True},
     "step 'a', cache: cannot be cached: the step is not idempotent (tool 'effect' is not"),
    ({"tool": "square", "cache": {"ttl": 5}, "idempotent": False}, "the step says idempotent: false"),
    ({"tool": "square", "cache": True, "writes": ["out"]}, "the step writes 'out'"),
    ({"tool": "square", "cache": True, "approval": "Go?"}, "the step waits for approval"),
    ({"tool": "human.input", "args": {"prompt": "?"}, "cache": True}, "tool 'human.input' asks a person"),
])
def test_asking_for_the_cache_where_it_is_not_safe_is_refused_naming_the_step(step: dict[str, Any],
                                                                                message: str) -> None:
    pure = Pure()

    async def go() -> None:
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=pure.toolbox()) as engine:
            await engine.start(plan({"id": "a", "args": {"x": 1}, **step} if "args" not in step
                                    else {"id": "a", **step}))

    with pytest.raises(PlanInvalid) as caught:
        run_virtual(go())
    assert message in str(caught.value)
    assert not pure.calls


def test_a_tool_that_is_not_idempotent_cannot_be_declared_cacheable() -> None:
    async def send(to: str) -> None:
        """Send a mail."""

    with pytest.raises(ValueError, match="tool 'send' cannot be cached: it is not idempotent"):
        tool(send, cache=True)
    with pytest.raises(ValueError, match="tool 'send': cache ttl must be a number of seconds above 0"):
        tool(send, idempotent=True, cache={"ttl": -1})
    with pytest.raises(ValueError, match="tool 'send': cache has no option 'tll'"):
        tool(send, idempotent=True, cache={"tll": 5})
    assert tool(send, idempotent=True, cache={"ttl": 5}).cache is not None


def test_a_cache_hit_survives_resume(journal_at: JournalAt) -> None:
    pure = Pure()
    doc = plan({"id": "a", "tool": "square", "args": {"x": 3}},
               {"id": "gate", "tool": "sleep", "args": {"seconds": 1000}, "after": ["a"]},
               {"id": "b", "tool": "square", "args": {"x": "${a.y}"}, "after": ["gate"]})

    async def first() -> None:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as e:
            assert (await (await e.start(plan({"id": "a", "tool": "square", "args": {"x": 3}}), run_id="src")
                           ).wait()).ok

    async def interrupted() -> None:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as e:
            await e.start(doc, run_id="hit")
            await asyncio.sleep(10)  # a served from the cache, the gate sleeping: the engine closes

    async def resumed() -> RunResult:
        async with journal_at.open() as journal, Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as e:
            return await (await e.resume("hit")).wait()

    run_virtual(first())
    run_virtual(interrupted())
    result = run_virtual(resumed())
    assert result.ok and result.outputs["a"] == {"y": 9} and result.outputs["b"] == {"y": 81}
    assert pure.calls == {"square(3)": 1, "square(9)": 1}  # a never again: neither served twice nor called
    kinds = [(e.kind, e.step) for e in journal_at.events("hit") if e.step == "a"]
    assert kinds == [("step_started", "a"), ("step_succeeded", "a")]


def test_prune_removes_the_entries_of_pruned_runs_and_keeps_the_outputs_of_runs_that_reused_them(
        journal_at: JournalAt) -> None:
    pure = Pure()
    one = plan({"id": "a", "tool": "square", "args": {"x": 7}})

    async def go() -> tuple[Any, Any, Any]:
        async with journal_at.open() as journal:
            async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as engine:
                await (await engine.start(one, run_id="src")).wait()
                await asyncio.sleep(10)
                hit = await (await engine.start(one, run_id="hit")).wait()
            (src_end,) = [e.at for e in await journal.read("src") if e.kind == "run_finished"]
            pruned = await journal.prune(src_end + 1)  # src alone ended before then (on the virtual clock)
            kept = await journal.get_blobs([hit.state.records["a"].output_ref or ""])
            async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox()) as engine:
                again = await (await engine.start(one, run_id="again")).wait()
            return pruned, kept, again

    pruned, kept, again = run_virtual(go())
    assert pruned.runs == ["src"]
    assert list(kept.values()) == [{"y": 49}]  # the hit's output is its own reference: kept
    # src's entry went with it (a hit is not indexed again), so the next run called the tool, and is indexed.
    assert again.outputs == {"a": {"y": 49}} and pure.calls == {"square(7)": 2}
    assert "cache_key" in next(e.data for e in journal_at.events("again") if e.kind == "step_succeeded")


def test_an_output_the_journal_stores_redacted_is_never_reused() -> None:
    pure = Pure()

    def redact(value: Any) -> Any:
        return {"y": "***"} if value == {"y": 9} else value

    async def go() -> list[RunResult]:
        journal = MemoryJournal()
        results = []
        for x in (3, 3, 2, 2):
            async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox(), redact=redact) as engine:
                results.append(await (await engine.start(plan({"id": "a", "tool": "square", "args": {"x": x}}))
                                      ).wait())
        return results

    results = run_virtual(go())
    assert [r.outputs["a"] for r in results] == [{"y": 9}, {"y": 9}, {"y": 4}, {"y": 4}]
    assert pure.calls == {"square(3)": 2, "square(2)": 1}


# -- the cache never changes a result -----------------------------------------------------------------------------
@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    """Chains and fans of square/plain steps over a few small arguments (so that calls repeat), some referring to
    earlier steps' outputs, some with ttls, some refusing the cache."""
    steps: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 7))):
        x: Any = draw(st.integers(0, 3))
        if i > 0 and draw(st.booleans()):
            x = f"${{s{draw(st.integers(0, i - 1))}.y}}"
        step: dict[str, Any] = {"id": f"s{i}", "tool": draw(st.sampled_from(["square", "plain", "fresh"])),
                                "args": {"x": x}}
        if step["tool"] == "square":
            step["args"]["seconds"] = draw(st.sampled_from([0, 1, 3]))
        choice = draw(st.sampled_from(["tool", "off", "ttl", "on"]))
        if choice == "off":
            step["cache"] = False
        elif choice == "ttl":
            step["cache"] = {"ttl": draw(st.sampled_from([1, 5, 50]))}
        elif choice == "on":
            step["cache"] = True
        steps.append(step)
    return plan(*steps)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(plans(), min_size=1, max_size=4), gaps=st.lists(st.sampled_from([0, 2, 10, 60]), min_size=4,
                                                                      max_size=4))
def test_outputs_with_the_cache_equal_those_without(docs: list[dict[str, Any]], gaps: list[int]) -> None:
    def outputs(cache: bool) -> tuple[list[Any], Pure]:
        pure = Pure()

        async def go() -> list[Any]:
            journal = MemoryJournal()
            found = []
            async with Engine(journal, clock=VirtualClock(), tools=pure.toolbox(), cache=cache) as engine:
                for doc, gap in zip([*docs, *docs], [*gaps, *gaps], strict=False):  # every plan twice
                    await asyncio.sleep(gap)
                    result = await (await engine.start(doc)).wait()
                    found.append((result.status, result.outputs))
            return found

        return run_virtual(go()), pure

    cached, with_cache = outputs(True)
    plain, without = outputs(False)
    assert cached == plain
    assert with_cache.calls.total() <= without.calls.total()


@pytest.mark.parametrize(("cache", "message"), [
    ({"ttl": -1}, "step 'a', cache: Value error, ttl: Input should be greater than 0"),
    ({"tll": 5}, "step 'a', cache: Value error, has no option 'tll' (only ttl)"),
    (3, "step 'a', cache: Value error, must be true, false or {ttl: seconds}"),
])
def test_a_bad_cache_option_is_one_clear_problem(cache: Any, message: str) -> None:
    with pytest.raises(PlanInvalid) as caught:
        parse_plan_document(plan({"id": "a", "tool": "noop", "cache": cache}), "plan.yaml")
    assert [f"step '{p.step}', {p.field}: {p.message}" for p in caught.value.problems] == [message]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(plans(), min_size=1, max_size=3))
def test_outputs_with_the_cache_equal_those_without_across_restarts_on_sqlite(docs: list[dict[str, Any]]) -> None:
    def outputs(cache: bool) -> list[Any]:
        pure = Pure()
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/runs.db"

            async def go() -> list[Any]:
                found = []
                for doc in [*docs, *docs]:  # every plan twice, each run in a new engine (a restarted process)
                    async with open_journal(url) as journal, Engine(journal, clock=VirtualClock(),
                                                                      tools=pure.toolbox(), cache=cache) as engine:
                        result = await (await engine.start(doc)).wait()
                        found.append((result.status, result.outputs))
                return found

            return run_virtual(go())

    assert outputs(True) == outputs(False)
