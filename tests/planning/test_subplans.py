"""Sub-plans (``tool: plan``): a step planned and run as a child run, against the scripted model server.

Real parts: the scripted OpenAI-compatible server on 127.0.0.1, a SQLite journal, the engine on the virtual clock,
tools that append to a side-effect file (tests/cli/subplan_tools.py), so "ran once" is counted outside the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planweave import VirtualClock, builtin_tools, open_engine
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine.runtime import RunResult
from planweave.limits import JournaledLimits, RunLimits
from planweave.models.openai import OpenAIChatClient
from planweave.planning import build_planning_loop
from planweave.planning.subplans import parent_of
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM
from tests.cli.subplan_tools import toolbox as marks
from tests.planning.subplan_world import MARK, TREE, goal_of, world
from tests.timing import on_virtual_clock


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.log"
    monkeypatch.setenv("SUBPLAN_LOG", str(path))
    monkeypatch.delenv("SUBPLAN_GATE", raising=False)
    return path


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


async def states(url: str, *run_ids: str) -> dict[str, RunState]:
    async with open_engine(url) as engine:
        return {rid: RunState.from_events(rid, await engine.journal.read(rid)) for rid in run_ids}


async def run_tree(url: str, script: Callable[[RecordedRequest], Reply], *, limits: RunLimits | None = None,
                   max_depth: int = 3, on_event: Callable[[Any, Event], None] | None = None,
                   goal: str = "root") -> tuple[RunResult, list[str]]:
    """Run ``goal`` (run id: the goal) to its end; return its result and the ids of every run the engine
    started."""
    started: list[str] = []
    async with ScriptedLLM(script) as base_url, \
            OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine(url, clock=VirtualClock()) as engine:
        engine.subscribe(lambda e: started.append(e.run_id) if e.kind == "run_created" else None)
        if on_event is not None:
            engine.subscribe(lambda e: on_event(engine, e))
        loop = build_planning_loop(engine, client, builtin_tools().merged(marks), limits or RunLimits(),
                                   max_depth=max_depth)
        result = await loop.run(goal, run_id=goal)
    return result, started


@on_virtual_clock
async def test_a_three_level_tree_runs_to_its_answer(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result, started = await run_tree(url, world())
    assert result.ok, result.error
    assert result.state.answer == "root answer"
    assert started == ["root", "root.mid", "root.mid.leaf"]
    assert result.outputs["mid"]["answer"] == "mid answer" and result.outputs["mid"]["run"] == "root.mid"
    assert "succeeded" in result.outputs["mid"]["summary"]
    assert result.outputs["top"]["v"] == "mid answer"  # the parent refers to its child's answer
    assert sorted(ran(log)) == ["l1", "l2", "m1", "top"]  # each tool call once
    got = await states(url, "root.mid", "root.mid.leaf")
    assert got["root.mid.leaf"].answer == "leaf answer" and got["root.mid"].status == "succeeded"
    async with open_engine(url) as engine:
        assert parent_of(await engine.journal.read("root.mid.leaf")) == {"run": "root.mid", "step": "leaf",
                                                                          "depth": 2}
        assert parent_of(await engine.journal.read("root")) is None


@on_virtual_clock
async def test_a_plan_step_deeper_than_the_limit_fails_naming_the_depth(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    repairs = {"mid": [{"id": "leaf_done", "tool": MARK, "args": {"step": "leaf_done"}}]}
    result, started = await run_tree(url, world(repairs=repairs), max_depth=1)
    assert started == ["root", "root.mid"]  # no grandchild was started
    async with open_engine(url) as engine:
        failed = [e for e in await engine.journal.read("root.mid") if e.kind == "step_failed" and e.step == "leaf"]
    error = str(failed[0].data.get("error"))
    assert "sub-plan depth limit (1) reached" in error and "depth 1" in error, error
    assert result.ok, result.error  # the child's planner repaired the refused step; the tree still answered
    assert "leaf_done" in ran(log) and "l1" not in ran(log)


@on_virtual_clock
async def test_a_failed_child_is_repaired_by_its_parent(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plans = {
        "root": [{"id": "sub", "tool": "plan", "args": {"goal": "flaky"}},
                 {"id": "top", "tool": MARK, "args": {"step": "top", "v": "${sub.answer}"}}],
        "flaky": [{"id": "f1", "tool": MARK, "args": {"step": "f1", "fail": True}}],
        "steady": [{"id": "s1", "tool": MARK, "args": {"step": "s1"}}],
    }
    # The root's repair replaces its failed plan step (and what depended on it) by a sub-plan that works.
    repairs = {"root": [{"id": "sub2", "tool": "plan", "args": {"goal": "steady"}},
                        {"id": "top", "tool": MARK, "args": {"step": "top", "v": "${sub2.answer}"}}]}
    result, started = await run_tree(url, world(plans, repairs=repairs), limits=RunLimits(max_replans=1))
    assert result.ok, result.error
    assert started == ["root", "root.sub", "root.sub2"]
    async with open_engine(url) as engine:
        failed = [e for e in await engine.journal.read("root") if e.kind == "step_failed" and e.step == "sub"]
    assert failed and failed[-1].data.get("final"), failed
    assert "sub-plan run 'root.sub' failed" in str(failed[-1].data.get("error"))
    assert result.outputs["top"]["v"] == "steady answer"
    assert (await states(url, "root.sub"))["root.sub"].status == "failed"
    assert ran(log).count("top") == 1 and "s1" in ran(log)


@on_virtual_clock
async def test_cancelling_the_parent_cancels_the_whole_tree(tmp_path: Path, log: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("SUBPLAN_GATE", str(tmp_path / "never"))  # l2 waits for good

    def on_event(engine: Any, event: Event) -> None:
        if event.run_id == "root.mid.leaf" and event.kind == "step_started" and event.step == "l2":
            engine.get("root").cancel("stop the tree")

    result, started = await run_tree(url, world(), on_event=on_event)
    assert result.status == "cancelled"
    assert started == ["root", "root.mid", "root.mid.leaf"]
    got = await states(url, "root.mid", "root.mid.leaf")
    assert got["root.mid"].status == "cancelled" and got["root.mid.leaf"].status == "cancelled"
    assert "stop the tree" in str(got["root.mid.leaf"].error)
    assert "top" not in ran(log)


@on_virtual_clock
async def test_a_child_spends_within_its_slice_of_the_parent_budget(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result, _ = await run_tree(url, world(), limits=RunLimits(budget_tokens=60_000))
    assert result.ok, result.error
    async with open_engine(url) as engine:
        recorded = {rid: JournaledLimits.from_events(await engine.journal.read(rid))
                    for rid in ("root", "root.mid", "root.mid.leaf")}
    mid, leaf = recorded["root.mid"], recorded["root.mid.leaf"]
    # A fair share: half of what the root had neither spent nor reserved (its planner was still writing).
    assert mid.limits.budget_tokens is not None and 20_000 < mid.limits.budget_tokens <= 30_000
    assert leaf.limits.budget_tokens is not None and leaf.limits.budget_tokens <= mid.limits.budget_tokens // 2
    assert 0 < leaf.spent_tokens <= leaf.limits.budget_tokens
    assert 0 < mid.spent_tokens <= mid.limits.budget_tokens  # its own calls plus its child's, reported
    assert recorded["root"].spent_tokens <= 60_000
    assert recorded["root"].spent_tokens >= mid.spent_tokens  # the root's journal counts its child's spend


def test_tree_plans_are_what_the_world_says() -> None:  # guard: the scripted world's tree has three levels
    assert {s["tool"] for s in TREE["root"]} == {"plan", MARK} and asyncio.iscoroutinefunction(marks[MARK].fn)


@on_virtual_clock
async def test_an_approval_inside_a_child_waits_for_a_person_like_any_other(tmp_path: Path,
                                                                                    log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plans = {"root": [{"id": "sub", "tool": "plan", "args": {"goal": "careful"}}],
             "careful": [{"id": "risky", "tool": MARK, "args": {"step": "risky"}, "approval": "really?"}]}
    replies: list[str] = []
    answers: list[asyncio.Task[None]] = []

    def on_event(engine: Any, event: Event) -> None:
        if event.kind == "approval_requested":  # a person approves the child's step, as on the dashboard
            replies.append(f"{event.run_id}/{event.step}")
            answers.append(asyncio.ensure_future(engine.get(event.run_id).approve(str(event.step))))

    result, started = await run_tree(url, world(plans), on_event=on_event)
    assert result.ok, result.error
    assert started == ["root", "root.sub"] and replies == ["root.sub/risky"] and all(a.done() for a in answers)
    assert ran(log) == ["risky"]


@on_virtual_clock
async def test_a_child_gets_the_earlier_deadline_and_only_the_tools_it_is_given(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plans = {"root": [{"id": "short", "tool": "plan", "args": {"goal": "g1", "deadline": 5, "tools": [MARK]}},
                      {"id": "long", "tool": "plan", "args": {"goal": "g2", "deadline": 5000}},
                      {"id": "bad", "tool": "plan", "args": {"goal": "g3", "tools": ["nope"]}}],
             "g1": [{"id": "a", "tool": MARK, "args": {"step": "a"}}],
             "g2": [{"id": "b", "tool": MARK, "args": {"step": "b"}}]}
    seen: dict[str, str] = {}
    planner = world(plans, repairs={"root": []})

    def script(req: RecordedRequest) -> Reply:
        seen.setdefault(goal_of(req), str(req.messages[0]["content"]))
        return planner(req)

    result, started = await run_tree(url, script, limits=RunLimits(deadline=100))
    assert started == ["root", "root.short", "root.long"]  # 'bad' was refused before a child started
    async with open_engine(url) as engine:
        short = JournaledLimits.from_events(await engine.journal.read("root.short"))
        long = JournaledLimits.from_events(await engine.journal.read("root.long"))
        root = await engine.journal.read("root")
    assert short.limits.deadline == 5
    assert long.limits.deadline is not None and long.limits.deadline <= 100  # the parent's time left, not 5000
    tools = seen["g1"].split("Tools:\n", 1)[1].split("\n\n", 1)[0]  # the tools the child's planner was shown
    assert MARK in tools and "llm" in tools and "noop" not in tools and "sleep" not in tools, tools
    assert "noop" in seen["g2"]  # no tools given: all the parent's
    bad = [e for e in root if e.kind == "step_failed" and e.step == "bad"]
    assert "unknown tool(s) ['nope']" in str(bad[0].data.get("error")), bad
    assert result.ok, result.error



@on_virtual_clock
async def test_a_plan_step_with_a_heartbeat_is_kept_alive_by_its_childs_progress(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plans: dict[str, list[dict[str, Any]]] = {
             "root": [{"id": "sub", "tool": "plan", "args": {"goal": "slow"}, "heartbeat": 2}],
             "slow": [{"id": "s1", "tool": "sleep", "args": {"seconds": 1.5}},
                      {"id": "s2", "tool": "sleep", "args": {"seconds": 1.5}, "after": ["s1"]},
                      {"id": "s3", "tool": "sleep", "args": {"seconds": 1.5}, "after": ["s2"]}]}
    result, _ = await run_tree(url, world(plans))
    assert result.ok, result.error  # 4.5 s of child work under a 2 s heartbeat: never taken for hung
    assert result.state.records["sub"].attempts == 1


@on_virtual_clock
async def test_a_child_that_already_succeeded_is_reused_and_its_spend_counted_once(tmp_path: Path,
                                                                                 log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plans = {**TREE, "root.mid": TREE["mid"]}  # the run 'root.mid' plans goal 'root.mid' as 'mid' would
    answers = {"root": "root answer", "root.mid": "mid answer", "leaf": "leaf answer"}
    first, _ = await run_tree(url, world(plans, answers), goal="root.mid")  # as if it ran before a kill
    assert first.ok, first.error
    root_plan = [{"id": "mid", "tool": "plan", "args": {"goal": "root.mid"}},
                 {"id": "top", "tool": MARK, "args": {"step": "top", "v": "${mid.answer}"}}]
    result, started = await run_tree(url, world({**plans, "root": root_plan}, answers))
    assert result.ok, result.error
    assert started == ["root"]  # no child started: the finished one gave its answer
    assert result.outputs["mid"]["answer"] == "mid answer" and result.outputs["top"]["v"] == "mid answer"
    assert sorted(ran(log)) == ["l1", "l2", "m1", "top"]  # the child's steps did not run again
    counted = [c for c in result.state.model_calls if c.get("run") == "root.mid"]
    assert len(counted) == 1 and counted[0]["completion_tokens"] == first.state.tokens > 0  # its leaf's included
