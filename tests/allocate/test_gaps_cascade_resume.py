"""A cascade survives a crash: a run killed after an escalation resumes on the escalated tier.

Plan files journal ``--cascade`` (``options.limits.cascade``) and their tier table; a resumed run's cascades are
seeded from its journaled ``escalation`` events (``CascadeSeam`` on the run's first cascaded attempt,
``PlannerCascade.restore`` for a goal run's planner), so the next step (or the joiner) calls the escalated model,
not the cheapest one. Real processes, SIGKILL, the scripted server."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import yaml

from planweave import open_journal
from planweave.allocate.cascade import Cascade
from planweave.allocate.monitors import Fire
from planweave.core.state import RunState
from planweave.limits import JournaledLimits
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.testing.scripted_llm import plan_lines
from tests.allocate.conftest import planner_script
from tests.allocate.test_pressure_goal_resume import planweave

TIERS = {
    "small": {"model": "m-small", "p_success": 0.9, "duration_s": 10, "cost_usd": 0.0001},
    "large": {"model": "m-large", "p_success": 0.99, "duration_s": 15, "cost_usd": 0.001},
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def llm(sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "llm", "retries": 2, **extra, "args": {
        "prompt": f"{sid}?", "model": "auto", "tiers": ["small", "large"], "schema": SCHEMA, "max_tokens": 20}}


async def kill_when_running(proc: asyncio.subprocess.Process, url: str, step: str) -> str:
    """SIGKILL ``proc`` once its run's ``step`` is running; the run's id."""
    for _ in range(400):
        await asyncio.sleep(0.05)
        async with open_journal(url) as journal:
            ids = await journal.run_ids()
            if ids:
                state = RunState.from_events(ids[0], await journal.read(ids[0]))
                if step in state.records and state.records[step].status == "running":
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                    return ids[0]
    proc.kill()
    raise AssertionError(f"step '{step}' never ran")


async def test_a_plan_run_killed_after_an_escalation_resumes_on_the_escalated_tier(tmp_path: Path) -> None:
    plan, tiers = tmp_path / "plan.yaml", tmp_path / "tiers.yaml"
    steps = [llm("a"), {"id": "wait", "tool": "sleep", "args": {"seconds": 5}, "after": ["a"]},
             llm("b", after=["wait"])]
    plan.write_text(yaml.safe_dump({"steps": steps}), encoding="utf-8")
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    calls: list[tuple[str, str]] = []

    def script(request: RecordedRequest) -> Reply:
        prompt = str(request.messages[-1].get("content"))
        calls.append((prompt, str(request.body["model"])))
        return Text('{"answer": "yes"}' if request.body["model"] == "m-large" else '{"nope": 1}')

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    async with ScriptedLLM(script) as base_url:
        first = await planweave("run", str(plan), "--model", "m-small", "--base-url", base_url, "--config",
                                f"tiers={tiers}", "--config", "cascade=true", "--journal", url, "--json", cwd=tmp_path)
        run_id = await kill_when_running(first, url, "wait")
        async with open_journal(url) as journal:
            before = list(await journal.read(run_id))
        calls_before = list(calls)
        again = await planweave("resume", run_id, "--journal", url, "--base-url", base_url, "--json", cwd=tmp_path)
        _, err = await asyncio.wait_for(again.communicate(), 120)
        async with open_journal(url) as journal:
            after = list(await journal.read(run_id))
    assert JournaledLimits.from_events(before).cascade is True
    assert calls_before == [("a?", "m-small"), ("a?", "m-large")]  # escalated by its schema (milestone)
    assert again.returncode == 0, err.decode()
    assert calls[len(calls_before):] == [("b?", "m-large")]  # the resumed cascade starts where it was
    assert not [e for e in after if e.kind == "allocation"]  # --cascade kept: b cascaded, not allocated


def test_a_cascade_restored_from_its_moves_has_their_index_and_open_floors() -> None:
    moves: list[dict[str, Any]] = [
        {"step": "a", "rung": "escalate", "to_tier": "m"}, {"step": "b", "rung": "escalate", "to_tier": "l"},
        {"step": None, "rung": "deescalate", "to_tier": "m"}, {"step": "c", "rung": "escalate", "to_tier": "x"}]
    cascade = Cascade(("s", "m", "l"))
    cascade.restore(moves, done=["a"])
    assert cascade.tier == "m"  # the last move's tier; a tier it does not have is ignored
    assert cascade.tier_for("b") == "l" and cascade.tier_for("a") == "m"  # b's floor is open, a succeeded since
    fresh = Cascade(("s", "m", "l"))
    assert fresh.fired("b", Fire("stuck", "x")) is not None and fresh.tier_for("b") == "m"


GOAL_PLAN = [{"id": "wait", "tool": "sleep", "args": {"seconds": 5}}]


async def test_a_goal_run_killed_after_its_planner_escalated_resumes_on_the_escalated_planner(
        tmp_path: Path) -> None:
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(yaml.safe_dump(TIERS), encoding="utf-8")
    seen: list[tuple[str, str]] = []

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    # the small planner names a tool that does not exist, again and again
    async with ScriptedLLM(planner_script(seen, bad_model="m-small", plan=plan_lines(GOAL_PLAN))) as base_url:
        first = await planweave("goal", "g", "--model", "m-small", "--base-url", base_url, "--config",
                                f"tiers={tiers}", "--config", "cascade=true", "--journal", url, "--json", cwd=tmp_path)
        run_id = await kill_when_running(first, url, "wait")
        seen_before = list(seen)
        again = await planweave("resume", run_id, "--journal", url, "--model", "m-small", "--base-url", base_url,
                                "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(again.communicate(), 120)
    assert seen_before == [("plan", "m-small"), ("plan", "m-small"), ("plan", "m-large")]
    assert again.returncode == 0, err.decode()
    assert json.loads(out)["answer"] == "done"
    assert seen[len(seen_before):] == [("join", "m-large")]  # not --model's m-small
