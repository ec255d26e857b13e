"""The llm tool with ``model: auto`` in real runs against the scripted model server (per-model quality): the
allocator's choice reaches the server, each decision is journaled and ``planweave show`` lists it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from planweave import Toolbox, open_engine
from planweave.allocate import AllocationSeam, Allocator, TierProfile, TierTable
from planweave.cli.main import app
from planweave.core.clock import RealClock
from planweave.core.errors import ToolError
from planweave.core.events import Event
from planweave.engine.executor import ThreadExecutor
from planweave.engine.runtime import Engine
from planweave.journal.memory import MemoryJournal
from planweave.models import Budget, Chunk, Completion, CompletionRequest
from planweave.models.openai import Backoff, OpenAIChatClient, reset_server_compat
from planweave.models.pricing import Price, PriceTable
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.tools.llm import llm_tool

PRICES = PriceTable({"m-small": Price(input=1.0, output=4.0), "m-large": Price(input=10.0, output=40.0)})
TIERS = TierTable({
    "small": TierProfile("small", "m-small", p_success=0.5, duration_s=10.0, cost_usd=0.0001),
    "large": TierProfile("large", "m-large", p_success=0.99, duration_s=15.0, cost_usd=0.001),
})
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture(autouse=True)
def _fresh_compat() -> Iterator[None]:
    reset_server_compat()
    yield
    reset_server_compat()


def by_quality(request: RecordedRequest) -> Reply:
    """m-large answers well; m-small answers with JSON that does not match the schema."""
    if request.body["model"] == "m-large":
        return Text('{"answer": "ok"}', prompt_tokens=20, completion_tokens=5)
    return Text('{"wrong": 1}', prompt_tokens=20, completion_tokens=5)


def step(sid: str, **args: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "llm", "retries": 2,
            "args": {"prompt": f"{sid}?", "model": "auto", "tiers": ["small", "large"], "schema": SCHEMA,
                     "max_tokens": 50, **args}}


@asynccontextmanager
async def serving(script: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("m-small", base_url=base_url, api_key="k", prices=PRICES,
                                                    backoff=Backoff(attempts=1, base=0.01, cap=0.02)) as client:
        yield server, client


async def run_plan(url: str, client: OpenAIChatClient, steps: list[dict[str, Any]], *, deadline_s: float | None,
                   budget: Budget | None) -> tuple[str, str, list[Event], AllocationSeam]:
    deadline_at = None if deadline_s is None else RealClock().now() + deadline_s
    seam = AllocationSeam(TIERS, allocator=Allocator(TIERS, sims=200), deadline_at=deadline_at)
    tools = Toolbox({"llm": llm_tool(client, budget, prices=PRICES, allocation=seam)})
    async with open_engine(url, tools=tools) as engine:
        seam.bind(engine.get)
        run = await engine.start({"steps": steps})
        result = await run.wait()
        events = await engine.journal.read(run.id)
    return run.id, result.status, list(events), seam


def allocations(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == "allocation"]


def test_a_deadline_without_room_for_retries_takes_the_strong_tier(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def scenario() -> tuple[str, str, list[Event], list[str]]:
        async with serving(by_quality) as (server, client):
            # 18 s (declared seconds: the allocator's view; the scripted server answers at once): small's retry
            # (10 + 0.5 + 10 s) does not fit, large (15 s) does, with 3 s to spare for the machine's own delays
            run_id, status, events, _ = await run_plan(url, client, [step("a")], deadline_s=18.0, budget=None)
        return run_id, status, events, [r.body["model"] for r in server.chat_requests]

    run_id, status, events, models = asyncio.run(scenario())
    assert status == "succeeded"
    assert models == ["m-large"]
    (decision,) = allocations(events)
    assert decision.step == "a" and decision.data["tier"] == "large" and decision.data["samples"] == 1
    compared = {c["tier"]: c for c in decision.data["compared"]}
    assert compared["large"]["p_all"] > 0.95 > compared["small"]["p_all"]
    # planweave show lists the decision; show --json has it
    runner = CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None})
    shown = runner.invoke(app, ["show", run_id, "--journal", url])
    assert shown.exit_code == 0, shown.output
    assert "allocations" in shown.output and "large x1" in shown.output
    as_json = json.loads(runner.invoke(app, ["show", run_id, "--journal", url, "--json"]).output)
    assert [(a["step"], a["tier"]) for a in as_json["allocations"]] == [("a", "large")]


async def test_a_budget_that_cannot_hold_the_strong_tier_gets_the_cheap_one_and_a_retry_is_reallocated(
        tmp_path: Path) -> None:
    # large's worst case (50 completion tokens at $40/M plus the prompt) does not fit $0.0015; small's does. The
    # small model fails the schema: each retry is a new decision, journaled with its attempt.
    async with serving(by_quality) as (server, client):
        budget = Budget(usd=0.0015)
        _, status, events, _ = await run_plan(f"sqlite:///{tmp_path / 'runs.db'}", client, [step("a")],
                                              deadline_s=None, budget=budget)
    assert status == "failed"
    assert {r.body["model"] for r in server.chat_requests} == {"m-small"}
    decisions = allocations(events)
    assert [(d.data["attempt"], d.data["tier"]) for d in decisions] == [(1, "small"), (2, "small"), (3, "small")]
    for d in decisions:
        assert {c["tier"]: c["fits"] for c in d.data["compared"] if c["samples"] == 1} == {"small": True,
                                                                                           "large": False}
    assert budget.spent_usd <= 0.0015 and budget.reserved_usd == 0


async def test_samples_run_in_parallel_and_the_vote_picks_the_majority(tmp_path: Path) -> None:
    answers = iter(['{"answer": "A"}', '{"answer": "B"}', '{"answer": "A"}'])

    def script(request: RecordedRequest) -> Reply:
        return Text(next(answers), prompt_tokens=10, completion_tokens=5, ttft=0.2)

    async with serving(script) as (server, client):
        plan = [{"id": "v", "tool": "llm", "args": {"prompt": "vote", "model": "m-small", "samples": 3,
                                                     "select": "vote", "schema": SCHEMA, "max_tokens": 20}}]
        _, status, events, _ = await run_plan(f"sqlite:///{tmp_path / 'runs.db'}", client, plan, deadline_s=None,
                                              budget=Budget(usd=1.0))
    assert status == "succeeded"
    starts = sorted(c.started for c in server.served)
    ends = sorted(c.ended or 0.0 for c in server.served)
    assert len(starts) == 3 and starts[-1] < ends[0]  # all three were in flight at once
    assert max(c.concurrency for c in server.served) == 3
    calls = [e for e in events if e.kind == "model_call"]
    assert len(calls) == 3 and all(e.step == "v" for e in calls)
    succeeded = next(e for e in events if e.kind == "step_succeeded")
    assert succeeded.step == "v"


async def test_model_auto_without_an_allocator_or_with_an_unknown_tier_fails_naming_it(tmp_path: Path) -> None:
    async with serving(by_quality) as (server, client):
        tools = Toolbox({"llm": llm_tool(client, prices=PRICES)})
        async with open_engine(f"sqlite:///{tmp_path / 'a.db'}", tools=tools) as engine:
            result = await (await engine.start({"steps": [step("a")]})).wait()
        assert result.status == "failed" and "needs a tier table" in (result.error or "")
        _, status, events, _ = await run_plan(f"sqlite:///{tmp_path / 'b.db'}", client,
                                              [step("a", tiers=["small", "huge"])], deadline_s=None, budget=None)
    assert status == "failed"
    failed = next(e for e in events if e.kind == "step_failed")
    assert "unknown tier 'huge'" in failed.data["error"] and failed.data["kind"] == "arguments"
    assert server.chat_requests == []


class Instant:
    """A model client answering at once (no HTTP: the thread executor runs the tool on a loop of its own)."""

    model = "m-small"

    async def complete(self, request: CompletionRequest) -> Completion:
        return Completion(text="ok", model=request.model or self.model, prompt_tokens=1, completion_tokens=1,
                          usage_source="server", cost_usd=0.0)

    async def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        yield await self.complete(request)


async def test_a_decision_made_in_a_worker_thread_is_journaled_on_the_engine_loop() -> None:
    seam = AllocationSeam(TIERS, allocator=Allocator(TIERS, sims=50),
                          deadline_at=RealClock().now() + 18.0)
    tools = Toolbox({"llm": llm_tool(Instant(), allocation=seam)})
    async with Engine(MemoryJournal(), tools=tools, executor=ThreadExecutor()) as engine:
        seam.bind(engine.get)
        emitted_on: list[int] = []

        def listen(event: Event) -> None:
            if event.kind == "allocation":
                emitted_on.append(threading.get_ident())

        run = await engine.start({"steps": [{"id": "a", "tool": "llm", "args": {
            "prompt": "a", "model": "auto", "tiers": ["small", "large"]}}]}, on_event=listen)
        result = await run.wait()
        events = await engine.journal.read(run.id)
    assert result.status == "succeeded", result.error
    assert [(e.step, e.data["tier"]) for e in allocations(list(events))] == [("a", "large")]
    assert result.outputs["a"]["model"] == "m-large"
    assert emitted_on == [threading.get_ident()]  # on the engine's loop, not the worker's thread


async def test_a_named_verifier_picks_among_samples_and_an_unknown_one_is_refused() -> None:
    checked: list[str] = []

    async def accepts_large(result: dict[str, Any]) -> bool:
        checked.append(result["model"])
        return bool(result["model"] == "m-large")

    tool = llm_tool(Instant(), verifiers={"large_only": accepts_large})
    result = await tool.invoke({"prompt": "x", "model": "m-large", "samples": 2, "verifier": "large_only"})
    assert result["samples"]["select"] == "verifier" and checked == ["m-large"]
    with pytest.raises(ToolError) as info:
        await tool.invoke({"prompt": "x", "model": "m-small", "verifier": "large_only"})
    assert info.value.kind == "rejected_by_verifier"
    with pytest.raises(ToolError) as info:
        await tool.invoke({"prompt": "x", "samples": 2, "verifier": "nope"})
    assert info.value.kind == "arguments" and "verifier 'nope'" in str(info.value) and "large_only" in str(info.value)
