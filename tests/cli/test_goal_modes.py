"""A goal run's planning modes (config keys ``context = references|summary``, ``subplans = false``) are journaled in its
``run_created`` and a resume plans with the journaled ones, not with today's defaults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from planweave import VirtualClock, builtin_tools, open_engine, open_journal, run_virtual
from planweave.cli.run_cmd import AgentFlags, _journaled_modes
from planweave.limits import JournaledLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.subplan_tools import toolbox as marks
from tests.threaded_llm import ThreadedLLM
from tests.timing import on_virtual_clock, until

from .test_cli import invoke, sqlite_url

GATED = [{"id": "a", "tool": "mark_idempotent", "args": {"step": "a", "gated": True}}]


def script(req: RecordedRequest) -> Reply:
    if "If the results answer the goal" in str(req.messages[-1]["content"]):
        return Text(json.dumps({"answer": "done"}))
    return Text(plan_lines(GATED))


def joins(requests: list[RecordedRequest]) -> list[str]:
    return [str(r.messages[-1]["content"]) for r in requests
            if "If the results answer the goal" in str(r.messages[-1]["content"])]


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SUBPLAN_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("SUBPLAN_GATE", str(tmp_path / "gate"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    return tmp_path / "gate"


@on_virtual_clock
async def test_a_resumed_goal_run_keeps_the_summary_context_and_no_subplans_it_started_with(
        tmp_path: Path, gate: Path) -> None:
    url = sqlite_url(tmp_path)
    tools = builtin_tools().merged(marks)
    llm = ScriptedLLM(script)
    async with llm as base_url:
        async with open_engine(url, clock=VirtualClock(), tools=tools) as engine, AsyncExitStack() as stack:
            flags = AgentFlags("scripted", base_url, None, None, None, 5, 2048, context="summary", subplans=False)
            loop = await flags.planning_loop(engine, stack, tools)
            run = await loop.start("g", run_id="r")
            await until(run, lambda s: "a" in s.records and s.records["a"].status == "running", "a running")
        # the engine closed under the gated step: the run is interrupted, as by a crash
        await asyncio.to_thread(gate.touch)
        async with open_engine(url, clock=VirtualClock(), tools=tools) as engine, AsyncExitStack() as stack:
            recorded = JournaledLimits.from_events(await engine.journal.read("r"))
            context, subplans = _journaled_modes("r", recorded)  # what `planweave resume --model` plans with
            again = AgentFlags("scripted", base_url, None, None, None, 5, 2048, context=context, subplans=subplans)
            resumed_loop = await again.planning_loop(engine, stack, tools)
            result = await (await resumed_loop.resume("r")).wait()
        requests = llm.chat_requests
    assert (recorded.context, recorded.subplans) == ("summary", False)
    assert (context, subplans) == ("summary", False)
    assert result.ok and result.state.answer == "done", result.error
    assert "plan" not in resumed_loop.tools and resumed_loop.options.context == "summary"
    (join,) = joins(requests)  # the resumed run's joiner was shown the state summary, not references
    assert "Done (reuse these by id, do not repeat them):\n- a (mark_idempotent) -> " in join, join
    assert "Report (" not in join
    planner = requests[0].messages[0]["content"]
    assert "- plan:" not in planner and "Keep a report" not in planner  # no plan tool, no report in the prompt


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadedLLM]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    llm = ScriptedLLM(lambda req: Text(json.dumps({"answer": "hi"}))
                      if "If the results answer" in str(req.messages[-1]["content"])
                      else Text(plan_lines([{"id": "n", "tool": "noop", "args": {}}])))
    with ThreadedLLM(llm) as server:
        yield server


@pytest.mark.parametrize(("flags", "context", "subplans"), [
    ((), "references", True),
    (("--config", "context=summary", "--config", "subplans=false"), "summary", False),
])
def test_run_goal_journals_the_context_and_subplans_it_plans_with(
        tmp_path: Path, served: ThreadedLLM, flags: tuple[str, ...], context: str, subplans: bool) -> None:
    url = sqlite_url(tmp_path)
    done = invoke("goal", "g", "--model", "scripted", "--base-url", served.url, "--journal", url,
                  "--run-id", "r", "--json", *flags)
    assert done.exit_code == 0, done.output
    limits = run_virtual(_created_limits(url, "r"))
    assert (limits["context"], limits["subplans"]) == (context, subplans)
    system = str(served.llm.chat_requests[0].messages[0]["content"])
    assert ("- plan:" in system) is subplans and ("Keep a report" in system) is (context == "references")


async def _created_limits(url: str, run_id: str) -> dict[str, object]:
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
    return dict(events[0].data["options"]["limits"])


@pytest.mark.parametrize(("args", "message"), [
    (("goal", "g", "--config", "context=everything"),
     "--config context=everything: key 'context': Input should be 'references' or 'summary'"),
    (("run", "plan.yaml", "--config", "context=summary"),
     "--config context=summary: key 'context' applies to goal runs (planweave goal)"),
    (("run", "plan.yaml", "--config", "subplans=false"), "key 'subplans' applies to goal runs"),
    (("run", "plan.yaml", "--no-subplans"), "--no-subplans is a key of the run configuration"),
])
def test_bad_planning_mode_keys_exit_2_naming_the_key(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "plan.yaml").write_text("steps: [{id: a, tool: noop}]\n")
    done = invoke(*[str(tmp_path / a) if a == "plan.yaml" else a for a in args], "--journal", "memory://")
    assert done.exit_code == 2 and message in done.output, done.output
