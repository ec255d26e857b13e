"""Budgeted model calls journal their worst case before they go out (``model_reserved``), settled by id, and what a
crash leaves unsettled is counted at that worst case: by the fold after a resume and by :class:`JournaledLimits`."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from planweave import Toolbox, open_journal
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine.executor import Executor, InProcessExecutor, ThreadExecutor
from planweave.engine.runtime import Engine
from planweave.limits import JournaledLimits
from planweave.models import Budget, Chunk, Completion, CompletionRequest
from planweave.models.openai import OpenAIChatClient
from planweave.testing import ScriptedLLM, Stall
from planweave.tools.llm import llm_tool

PLAN = {"steps": [{"id": "a", "tool": "llm", "args": {"prompt": "one", "max_tokens": 50}},
                  {"id": "b", "tool": "llm", "args": {"prompt": "two", "max_tokens": 50}, "after": ["a"]}]}


class Endpoint:
    """A model client without HTTP (the thread executor runs the tool on a loop of its own) that looks, as each
    request goes out, at what the journal file holds for good: read by another connection, as a process reading
    it after a SIGKILL would."""

    model = "m"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.durable_when_sent: list[int] = []

    async def complete(self, request: CompletionRequest) -> Completion:
        with sqlite3.connect(self.path) as conn:
            self.durable_when_sent.append(conn.execute(
                "SELECT count(*) FROM events WHERE kind = 'model_reserved'").fetchone()[0])
        return Completion(text="ok", model=self.model, prompt_tokens=5, completion_tokens=2, usage_source="server",
                          cost_usd=None)

    async def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        yield await self.complete(request)


@pytest.mark.parametrize("executor", [InProcessExecutor, ThreadExecutor], ids=["in-process", "thread"])
async def test_a_budgeted_call_is_journaled_durably_before_its_request_goes_out(
        tmp_path: Path, executor: type[Executor]) -> None:
    path = tmp_path / "runs.db"
    endpoint = Endpoint(path)
    tools = Toolbox({"llm": llm_tool(endpoint, Budget(tokens=1000))})
    async with open_journal(f"sqlite:///{path}") as journal, \
            Engine(journal, tools=tools, executor=executor()) as engine:
        result = await (await engine.start(PLAN, run_id="r1")).wait()
        events = await engine.journal.read("r1")
    assert result.ok, result.summary
    assert endpoint.durable_when_sent == [1, 2]
    reserved = [e for e in events if e.kind == "model_reserved"]
    calls = [e for e in events if e.kind == "model_call"]
    assert [e.step for e in reserved] == ["a", "b"] and all(e.data["tokens"] >= 50 for e in reserved)
    assert [c.data["reservation"] for c in calls] == [r.data["reservation"] for r in reserved]
    state = RunState.from_events("r1", events)
    assert not state.reserved and not state.unsettled and "reserved_unsettled" not in state.summary()
    assert JournaledLimits.from_events(events).unsettled_tokens == 0


async def test_a_call_cancelled_before_its_first_token_is_released(tmp_path: Path) -> None:
    async with ScriptedLLM([Stall()]) as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") \
            as client:
        tools = Toolbox({"llm": llm_tool(client, Budget(tokens=1000))})
        async with open_journal(f"sqlite:///{tmp_path / 'runs.db'}") as journal, \
                Engine(journal, tools=tools) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "llm", "args": {"prompt": "x"},
                                                 "timeout": 0.5}]}, run_id="r1")
            await run.wait()
            events = await engine.journal.read("r1")
    released = [e for e in events if e.kind == "model_released"]
    assert len(released) == 1
    assert JournaledLimits.from_events(events).spent_tokens == 0
    assert not RunState.from_events("r1", [*events, Event("r1", "run_resumed", 9e9)]).unsettled


def _journal(*kinds_and_data: tuple[str, dict[str, object]]) -> list[Event]:
    created = Event("r", "run_created", 0.0, None, {
        "plan": {"steps": [{"id": "a", "tool": "noop"}]}, "options": {"limits": {"budget_tokens": 1000}}})
    return [created, *(Event("r", kind, float(i), "a", data)
                       for i, (kind, data) in enumerate(kinds_and_data, 1))]


def test_a_reservation_left_open_counts_at_its_worst_case_after_a_resume() -> None:
    events = _journal(("model_reserved", {"reservation": "c1", "tokens": 120, "cost_usd": 0.5, "purpose": "llm_step"}),
                      ("model_call", {"reservation": "c1", "prompt_tokens": 10, "completion_tokens": 30}),
                      ("model_reserved", {"reservation": "c2", "tokens": 150, "cost_usd": 0.25, "purpose": "plan"}))
    limits = JournaledLimits.from_events(events)
    assert (limits.spent_tokens, limits.unsettled_tokens, limits.unsettled_usd) == (190, 150, 0.25)
    budget = limits.budget()
    assert budget is not None and budget.remaining_tokens == 810
    killed = RunState.from_events("r", events)
    assert killed.tokens == 40 and list(killed.reserved) == ["c2"]  # in flight, as far as the journal knows
    resumed = RunState.from_events("r", [*events, Event("r", "run_resumed", 9.0)])
    assert resumed.tokens == 190 and resumed.cost_usd == 0.25
    summary = resumed.summary()["reserved_unsettled"]
    assert summary["calls"] == 1 and summary["tokens"] == 150 and summary["each"][0]["purpose"] == "plan"
    # Settled after all (a process that lost the run ended the call): its usage replaces its worst case.
    late = RunState.from_events("r", [*events, Event("r", "run_resumed", 9.0), Event(
        "r", "model_call", 10.0, "a", {"reservation": "c2", "prompt_tokens": 20, "completion_tokens": 5})])
    assert late.tokens == 65 and not late.unsettled
