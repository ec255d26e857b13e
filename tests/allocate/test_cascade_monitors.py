"""Cascades end to end: ``model: cascade`` steps against the scripted model server, whose answers depend on the
model asked (per-model quality, and per-model latency through an async script function), on the virtual clock.

Each monitor: the step starts on the small tier, the monitor fires, the retry runs on the next tier and succeeds,
the journaled ``escalation`` event names the monitor; a streak of successes brings the cascade back down."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.allocate import AllocationSeam, TierProfile, TierTable
from planweave.allocate.cascade_seam import CascadeSeam
from planweave.cli.main import app
from planweave.core.events import Event
from planweave.models.openai import Backoff, OpenAIChatClient, reset_server_compat
from planweave.testing import HttpError, RecordedRequest, Reply, ScriptedLLM, Text
from planweave.testing.scripted_llm import split_tokens
from planweave.tools.llm import llm_tool
from tests.timing import on_virtual_clock

TIERS = TierTable({
    "small": TierProfile("small", "m-small", p_success=0.6, duration_s=1.0, cost_usd=0.0001),
    "medium": TierProfile("medium", "m-medium", p_success=0.8, duration_s=2.0, cost_usd=0.001),
    "large": TierProfile("large", "m-large", p_success=0.99, duration_s=4.0, cost_usd=0.01),
})
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture(autouse=True)
def _fresh_compat() -> Iterator[None]:
    reset_server_compat()
    yield
    reset_server_compat()


def model_of(request: RecordedRequest) -> str:
    return str(request.body["model"])


def llm_step(sid: str, prompt: str, *, retries: int = 2, after: list[str] | None = None,
             **args: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"id": sid, "tool": "llm", "retries": {"max": retries, "backoff": 0.5},
                            "args": {"prompt": prompt, "model": "cascade", "tiers": ["small", "medium", "large"],
                                     "max_tokens": 50, **args}}
    if after:
        step["after"] = after
    return step


@asynccontextmanager
async def serving(script: Any) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    server = ScriptedLLM(script)
    async with server as base_url, OpenAIChatClient("m-small", base_url=base_url, api_key="k",
                                                    backoff=Backoff(attempts=1, base=0.01, cap=0.02)) as client:
        yield server, client


async def run_plan(script: Any, steps: list[dict[str, Any]], url: str = "memory://"
                   ) -> tuple[str, str, list[Event], list[str], CascadeSeam]:
    """Run ``steps`` with a cascade over TIERS; the run's id, status and events, and the models the server saw."""
    async with serving(script) as (server, client):
        seam = CascadeSeam(TIERS)
        tools = Toolbox({"llm": llm_tool(client, cascade=seam)})
        async with open_engine(url, tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine)
            run = await engine.start({"steps": steps})
            result = await run.wait()
            events = list(await engine.journal.read(run.id))
    return run.id, result.status, events, [model_of(r) for r in server.chat_requests], seam


def escalations(events: list[Event]) -> list[tuple[str | None, str, str | None, str, str]]:
    return [(e.step, e.data["rung"], e.data.get("monitor"), e.data["from_tier"], e.data["to_tier"])
            for e in events if e.kind == "escalation" and e.data.get("rung") in ("escalate", "deescalate")]


# -- milestone: the schema check fails on the small model; a streak of successes de-escalates ------------------------
def by_quality(request: RecordedRequest) -> Reply:
    """The small model gets hard questions wrong (JSON that fails the schema); the others answer."""
    hard = "hard" in request.messages[-1]["content"]
    if model_of(request) == "m-small" and hard:
        return Text('{"wrong": 1}')
    return Text('{"answer": "ok"}')


@on_virtual_clock
async def test_a_failed_schema_check_escalates_the_step_and_a_streak_of_successes_deescalates() -> None:
    steps = [llm_step("a", "hard one", schema=SCHEMA, cascade={"streak": 2}),
             llm_step("b", "easy one", schema=SCHEMA, after=["a"]),
             llm_step("c", "easy two", schema=SCHEMA, after=["b"])]
    _, status, events, models, _ = await run_plan(by_quality, steps)
    assert status == "succeeded"
    # a: small fails the schema, its retry runs on medium; b starts where the cascade is (medium); after a's and
    # b's successes (a streak of 2) the cascade comes down, and c runs on small again
    assert models == ["m-small", "m-medium", "m-medium", "m-small"]
    assert escalations(events) == [("a", "escalate", "milestone", "small", "medium"),
                                   ("b", "deescalate", None, "medium", "small")]
    up = next(e for e in events if e.kind == "escalation" and e.data.get("rung") == "escalate")
    assert up.data["attempt"] == 1 and up.data["model"] == "m-medium" and "schema" in up.data["reason"]
    failed = [e for e in events if e.kind == "step_failed"]
    assert [(e.step, e.data["kind"]) for e in failed] == [("a", "malformed_output")]


@pytest.mark.parametrize("model", [None, "auto"])
@on_virtual_clock
async def test_cascade_settings_with_model_auto_or_none_make_a_cascade_too(model: str | None) -> None:
    step = llm_step("a", "hard", schema=SCHEMA, cascade=True)
    if model is None:
        del step["args"]["model"]
    else:
        step["args"]["model"] = model
    _, status, events, models, _ = await run_plan(by_quality, [step])
    assert status == "succeeded" and models == ["m-small", "m-medium"]
    assert escalations(events) == [("a", "escalate", "milestone", "small", "medium")]


@on_virtual_clock
async def test_a_verifier_that_rejects_the_small_models_answer_escalates() -> None:
    async def script(request: RecordedRequest) -> Reply:
        return Text("4" if model_of(request) != "m-small" else "5")

    async def is_four(result: dict[str, Any]) -> bool:
        return bool(result.get("text") == "4")

    async with serving(script) as (server, client):
        seam = CascadeSeam(TIERS)
        tools = Toolbox({"llm": llm_tool(client, cascade=seam, verifiers={"four": is_four})})
        async with open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine)
            run = await engine.start({"steps": [llm_step("sum", "2+2?", verifier="four")]})
            result = await run.wait()
            events = list(await engine.journal.read(run.id))
    assert result.status == "succeeded" and run.outputs["sum"]["text"] == "4"
    assert [model_of(r) for r in server.chat_requests] == ["m-small", "m-medium"]
    assert escalations(events) == [("sum", "escalate", "milestone", "small", "medium")]


@on_virtual_clock
async def test_a_verifies_step_rejecting_a_cascaded_step_escalates_its_cascade() -> None:
    steps = [llm_step("a", "easy", schema=SCHEMA),
             {"id": "check", "tool": "noop", "args": {"ok": False, "reason": "not good enough", "x": "${a.json}"},
              "verifies": "a"},
             llm_step("b", "easy", schema=SCHEMA, after=["check"])]
    async with serving(by_quality) as (server, client):
        seam = CascadeSeam(TIERS)
        tools = builtin_tools().merged(Toolbox({"llm": llm_tool(client, cascade=seam)}))
        async with open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine)
            run = await engine.start({"steps": steps})
            result = await run.wait()
            events = list(await engine.journal.read(run.id))
    assert result.status == "succeeded"
    assert escalations(events) == [("a", "escalate", "milestone", "small", "medium")]
    reason = next(e.data["reason"] for e in events if e.kind == "escalation")
    assert "verifier step 'check' failed: not good enough" in reason
    # the run has no planner to redo a: the next step of the cascade starts where it now is
    assert [model_of(r) for r in server.chat_requests] == ["m-small", "m-medium"]


# -- stuck: repeated failures, silence, the same answer again -------------------------------------------------------
@on_virtual_clock
async def test_repeated_failures_on_the_small_model_escalate_after_the_second() -> None:
    def script(request: RecordedRequest) -> Reply:
        if model_of(request) == "m-small":
            return HttpError(503, "overloaded")
        return Text("fine")

    _, status, events, models, _ = await run_plan(script, [llm_step("a", "go", retries=3)])
    assert status == "succeeded"
    assert models == ["m-small", "m-small", "m-medium"]  # two failures in a row (the default), then up one tier
    ((step, rung, monitor, low, high),) = escalations(events)
    assert (step, rung, monitor, low, high) == ("a", "escalate", "stuck", "small", "medium")
    up = next(e for e in events if e.kind == "escalation" and e.data.get("rung") == "escalate")
    assert up.data["attempt"] == 2 and "2 failures in a row" in up.data["reason"]


@on_virtual_clock
async def test_a_silent_small_model_is_abandoned_after_the_silence_and_the_retry_runs_on_the_next_tier() -> None:
    async def script(request: RecordedRequest) -> Reply:
        await asyncio.sleep(60.0 if model_of(request) == "m-small" else 1.0)  # per-model latency
        return Text("done")

    loop = asyncio.get_running_loop()
    started = loop.time()
    _, status, events, models, _ = await run_plan(script, [llm_step("slow", "go", cascade={"silence_s": 5})])
    took = loop.time() - started
    assert status == "succeeded"
    assert models == ["m-small", "m-medium"]
    assert escalations(events) == [("slow", "escalate", "stuck", "small", "medium")]
    failed = next(e for e in events if e.kind == "step_failed")
    assert failed.data["kind"] == "stuck" and "no progress for 5 s" in failed.data["error"]
    assert took < 10.0  # 5 s of silence, 0.5 s backoff, 1 s on medium: not the small model's 60 s


@on_virtual_clock
async def test_a_slow_model_that_keeps_streaming_is_not_stuck() -> None:
    def script(request: RecordedRequest) -> Reply:  # a token every 2 s for about 16 s: slow, never silent for 5 s
        return Text("one two three four five six seven eight", ttft=1.0, tokens_per_second=0.5)

    _, status, events, models, _ = await run_plan(script, [llm_step("slow", "go", cascade={"silence_s": 5})])
    assert status == "succeeded" and models == ["m-small"] and escalations(events) == []


@on_virtual_clock
async def test_the_same_wrong_answer_twice_is_stuck_when_the_schema_is_not_watched() -> None:
    steps = [llm_step("a", "hard", schema=SCHEMA, retries=3,
                      cascade={"monitors": ["stuck"], "failures": None, "repeats": 2})]

    def script(request: RecordedRequest) -> Reply:
        return Text('{"answer": 7}') if model_of(request) == "m-small" else Text('{"answer": "seven"}')

    _, status, events, models, _ = await run_plan(script, steps)
    # answer 7 is not a string: the schema fails twice on small without a milestone monitor, and the stuck monitor
    # does not see the answers (the client refused them): both attempts' failures are all it has, and failures is
    # off. A verifier sees the answers: the same one twice is stuck.
    assert status == "failed" and models == ["m-small"] * 4 and escalations(events) == []

    async def never(result: dict[str, Any]) -> bool:
        return False

    async with serving(lambda r: Text('{"answer": "same"}') if model_of(r) == "m-small"
                       else Text('{"answer": "other"}')) as (server, client):
        seam = CascadeSeam(TIERS)
        tools = Toolbox({"llm": llm_tool(client, cascade=seam, verifiers={"never": never})})
        async with open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine)
            run = await engine.start({"steps": [llm_step("b", "x", schema=SCHEMA, retries=3, verifier="never",
                                                         cascade={"monitors": ["stuck"], "failures": None,
                                                                  "repeats": 2})]})
            await run.wait()
            events = list(await engine.journal.read(run.id))
    assert [model_of(r) for r in server.chat_requests][:3] == ["m-small", "m-small", "m-medium"]
    first = escalations(events)[0]
    assert first == ("b", "escalate", "stuck", "small", "medium")
    reason = next(e.data["reason"] for e in events if e.kind == "escalation")
    assert "the same action 2 times" in reason


# -- low confidence: a reported confidence, or the top-logprob margin -----------------------------------------------
@on_virtual_clock
async def test_an_unconfident_answer_escalates_and_the_confident_one_is_kept() -> None:
    def script(request: RecordedRequest) -> Reply:
        sure = 0.3 if model_of(request) == "m-small" else 0.9
        return Text(json.dumps({"answer": model_of(request), "confidence": sure}))

    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
              "required": ["answer", "confidence"]}
    _, status, events, models, _ = await run_plan(script, [llm_step("q", "?", schema=schema)])
    assert status == "succeeded" and models == ["m-small", "m-medium"]
    assert escalations(events) == [("q", "escalate", "low_confidence", "small", "medium")]
    failed = next(e for e in events if e.kind == "step_failed")
    assert failed.data["kind"] == "low_confidence" and "0.300 below 0.5" in failed.data["error"]


@on_virtual_clock
async def test_a_small_logprob_margin_escalates_and_logprobs_are_asked_for_only_then() -> None:
    unsure = ((math.log(0.40), math.log(0.35)),)
    sure = ((math.log(0.97), math.log(0.02)),)

    def script(request: RecordedRequest) -> Reply:
        return Text("Paris", logprobs=unsure if model_of(request) == "m-small" else sure)

    steps = [llm_step("q", "capital?", cascade={"confidence": "logprobs", "min_confidence": 0.5}),
             llm_step("plain", "hi", after=["q"], cascade={"key": "other"})]
    async with serving(script) as (server, client):
        seam = CascadeSeam(TIERS)
        async with open_engine("memory://", tools=Toolbox({"llm": llm_tool(client, cascade=seam)}),
                               clock=VirtualClock()) as engine:
            seam.bind(engine)
            run = await engine.start({"steps": steps})
            result = await run.wait()
            events = list(await engine.journal.read(run.id))
    assert result.status == "succeeded"
    bodies = [r.body for r in server.chat_requests]
    assert [b["model"] for b in bodies] == ["m-small", "m-medium", "m-small"]
    assert [(b.get("logprobs"), b.get("top_logprobs")) for b in bodies] == [(True, 2), (True, 2), (None, None)]
    assert escalations(events) == [("q", "escalate", "low_confidence", "small", "medium")]
    assert run.outputs["q"]["cascade"] == {"tier": "medium", "key": "llm:small,medium,large", "confidence": 0.95}
    assert "logprobs" not in run.outputs["q"]


@on_virtual_clock
async def test_the_client_surfaces_logprobs_streamed_or_not_and_only_when_asked() -> None:
    from contextlib import aclosing

    from planweave.models import Completion, CompletionRequest

    top = ((math.log(0.6), math.log(0.3)), (math.log(0.9), math.log(0.05)))
    async with serving(lambda r: Text("alpha beta gamma", logprobs=top)) as (server, client):
        whole = await client.complete(CompletionRequest.of("x", logprobs=2))
        plain = await client.complete(CompletionRequest.of("x"))
        streamed: Completion | None = None
        async with aclosing(client.stream(CompletionRequest.of("x", logprobs=2))) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, Completion):
                    streamed = chunk
    pieces = len(split_tokens("alpha beta gamma"))  # the server's tokens; the last entry serves those past it
    expected = (top[0], *[top[1]] * (pieces - 1))
    assert whole.logprobs is not None and len(whole.logprobs) == pieces
    assert whole.logprobs == expected  # JSON carries doubles exactly
    assert streamed is not None and streamed.logprobs == expected
    assert plain.logprobs is None
    assert [("logprobs" in r.body, r.body.get("top_logprobs")) for r in server.chat_requests] == [
        (True, 2), (False, None), (True, 2)]


@on_virtual_clock
async def test_on_the_strongest_tier_an_unconfident_answer_stands() -> None:
    def script(request: RecordedRequest) -> Reply:
        return Text(json.dumps({"answer": "maybe", "confidence": 0.1}))

    _, status, events, models, _ = await run_plan(
        script, [{**llm_step("q", "?", schema={"type": "object"}), "args": {
            "prompt": "?", "model": "cascade", "tiers": ["small", "large"], "schema": {"type": "object"}}}])
    assert status == "succeeded" and models == ["m-small", "m-large"]
    assert escalations(events) == [("q", "escalate", "low_confidence", "small", "large")]


@on_virtual_clock
async def test_an_llm_tool_with_only_an_allocator_cascades_on_its_table_following_the_run() -> None:
    """As resume, workers and the server build it: no cascade given, so one on the allocator's table reads runs
    through the allocator and follows each run's events (the failures the stuck monitor counts, the successes)."""
    def script(request: RecordedRequest) -> Reply:
        return HttpError(503, "overloaded") if model_of(request) == "m-small" else Text("fine")

    async with serving(script) as (server, client):
        seam = AllocationSeam(TIERS)
        tools = Toolbox({"llm": llm_tool(client, allocation=seam)})
        async with open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine.get)
            run = await engine.start({"steps": [llm_step("a", "go", retries=3, cascade={"streak": 1}),
                                                llm_step("b", "go", after=["a"])]})
            result = await run.wait()
            events = list(await engine.journal.read(run.id))
    assert result.status == "succeeded"
    assert [model_of(r) for r in server.chat_requests] == ["m-small", "m-small", "m-medium", "m-small", "m-small",
                                                           "m-medium"]
    assert escalations(events) == [("a", "escalate", "stuck", "small", "medium"),
                                   ("a", "deescalate", None, "medium", "small"),
                                   ("b", "escalate", "stuck", "small", "medium"),
                                   ("b", "deescalate", None, "medium", "small")]  # the cascade's streak is a's


# -- what shows, and bad input --------------------------------------------------------------------------------------
def test_show_lists_the_escalations_with_the_monitor_and_the_tiers(tmp_path: Path) -> None:
    from planweave.core.clock import run_virtual

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id, status, _, _, _ = run_virtual(run_plan(by_quality, [llm_step("a", "hard", schema=SCHEMA)], url))
    assert status == "succeeded"
    runner = CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None})
    shown = runner.invoke(app, ["show", run_id, "--journal", url])
    assert shown.exit_code == 0, shown.output
    assert "escalate step 'a' (milestone): small -> medium" in shown.output
    as_json = json.loads(runner.invoke(app, ["show", run_id, "--journal", url, "--json"]).output)
    ups = [e for e in as_json["escalations"] if e["rung"] == "escalate"]
    assert [(e["step"], e["monitor"], e["from_tier"], e["to_tier"]) for e in ups] == [
        ("a", "milestone", "small", "medium")]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_escalations_read_back_the_same_from_every_durable_journal(backend: str, tmp_path: Path) -> None:
    from planweave.core.clock import run_virtual
    from planweave.journal import open_journal
    from tests.journal.conftest import _make as make_backend  # the conformance suite's backends

    steps = [llm_step("a", "hard one", schema=SCHEMA, cascade={"streak": 2}),
             llm_step("b", "easy one", schema=SCHEMA, after=["a"]),
             llm_step("c", "easy two", schema=SCHEMA, after=["b"])]
    for made in make_backend(backend, tmp_path):
        run_id, status, events, _, _ = run_virtual(run_plan(by_quality, steps, made.url))

        async def read_back(url: str = made.url, rid: str = run_id) -> list[Event]:
            async with open_journal(url) as journal:
                return list(await journal.read(rid))

        again = run_virtual(read_back())
    assert status == "succeeded"
    written = [e.data for e in events if e.kind == "escalation"]
    assert [dict(e.data) for e in again if e.kind == "escalation"] == [dict(d) for d in written]
    assert escalations(again) == [("a", "escalate", "milestone", "small", "medium"),
                                  ("b", "deescalate", None, "medium", "small")]


@pytest.mark.parametrize(("cascade", "message"), [
    ({"monitor": ["stuck"]}, "step 'a': 'cascade' has unknown setting 'monitor'"),
    ({"monitors": ["bored"]}, "'cascade.monitors' must list some of stuck, milestone, low_confidence"),
    ({"silence_s": -1}, "'cascade.silence_s' must be positive seconds"),
    ({"confidence": "vibes"}, "'cascade.confidence' must be 'answer'"),
    ({"streak": 0}, "'cascade.streak' must be a count of at least 1"),
])
@on_virtual_clock
async def test_bad_cascade_settings_fail_the_step_naming_the_setting(cascade: dict[str, Any], message: str) -> None:
    _, status, events, models, _ = await run_plan(lambda r: Text("x"), [llm_step("a", "go", cascade=cascade)])
    failed = next(e for e in events if e.kind == "step_failed")
    assert status == "failed" and models == []
    assert failed.data["kind"] == "arguments" and message in failed.data["error"]
    assert failed.data["final"] is True


@on_virtual_clock
async def test_model_cascade_without_a_tier_table_says_what_is_missing() -> None:
    async with (serving(lambda r: Text("x")) as (_, client),
                open_engine("memory://", tools=Toolbox({"llm": llm_tool(client)}), clock=VirtualClock()) as eng):
        run = await eng.start({"steps": [llm_step("a", "go")]})
        await run.wait()
        events = list(await eng.journal.read(run.id))
    failed = next(e for e in events if e.kind == "step_failed")
    assert "model: cascade needs a tier table" in failed.data["error"] and failed.data["kind"] == "arguments"
