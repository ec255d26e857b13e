"""OpenTelemetry: run → step attempt → tool call spans with attributes, errors, and nothing when it is off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from planweave import RunError, Toolbox, ToolError, builtin_tools, current_step, open_engine
from planweave.server import telemetry_from_env
from planweave.server.telemetry import TelemetryError, instrument, tracer_provider_from_env


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def toolbox() -> Toolbox:
    box = builtin_tools()

    async def explode(message: str) -> None:
        """Always fails."""
        raise ToolError(message, kind="boom")

    async def think(prompt: str) -> str:
        """Pretends to call a model and reports its usage."""
        current_step().report_usage({"model": "tiny-1", "prompt_tokens": 12, "completion_tokens": 3,
                                     "cost_usd": 0.0001, "purpose": "test"})
        return prompt.upper()

    box.add(explode)
    box.add(think, idempotent=True)
    return box


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def attempt_of(span: ReadableSpan) -> int:
    value = (span.attributes or {})["planweave.attempt"]
    assert isinstance(value, int)
    return value


async def test_the_span_tree_is_run_then_step_attempts_then_tool_calls(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    plan: dict[str, Any] = {"steps": [
        {"id": "a", "tool": "noop", "args": {"x": 1}},
        {"id": "b", "tool": "explode", "args": {"message": "it broke: ${a.x}"}, "retries": {"max": 1, "backoff": 0}},
        {"id": "c", "tool": "noop", "after": ["b"]},
        {"id": "d", "tool": "think", "args": {"prompt": "hi"}},
    ]}
    async with open_engine("memory://", tools=toolbox()) as engine:
        instrument(engine, provider)
        result = await (await engine.start(plan, run_id="traced")).wait()
    assert result.status == "failed"
    spans = exporter.get_finished_spans()

    [run] = by_name(spans, "planweave.run")
    assert run.parent is None
    assert run.attributes is not None and run.attributes["planweave.run_id"] == "traced"
    assert run.status.status_code is StatusCode.ERROR and "step 'b' failed" in (run.status.description or "")

    [a] = by_name(spans, "step a")
    assert parent_of(a) == span_id(run)
    assert dict(a.attributes or {}) == {"planweave.run_id": "traced", "planweave.step_id": "a",
                                        "planweave.attempt": 1, "planweave.tool": "noop"}
    assert a.status.status_code is StatusCode.OK
    [noop] = by_name(spans, "tool noop")
    assert parent_of(noop) == span_id(a)
    assert (noop.attributes or {})["planweave.tool"] == "noop"

    attempts = sorted(by_name(spans, "step b"), key=attempt_of)
    assert [attempt_of(s) for s in attempts] == [1, 2]
    calls = by_name(spans, "tool explode")
    assert len(calls) == 2
    for attempt in attempts:
        assert parent_of(attempt) == span_id(run)
        assert attempt.status.status_code is StatusCode.ERROR
        assert attempt.status.description == "it broke: 1"
        assert (attempt.attributes or {})["error.type"] == "boom"
        [call] = [c for c in calls if parent_of(c) == span_id(attempt)]
        assert call.status.status_code is StatusCode.ERROR
        assert any(e.name == "exception" for e in call.events)
        assert attempt_of(call) == attempt_of(attempt)
    assert [(s.attributes or {})["planweave.final"] for s in attempts] == [False, True]

    assert by_name(spans, "step c") == []  # skipped: it never ran

    [model] = by_name(spans, "model tiny-1")
    [think_call] = by_name(spans, "tool think")
    [d] = by_name(spans, "step d")
    assert parent_of(think_call) == span_id(d)
    assert parent_of(model) == span_id(d)
    assert (model.attributes or {})["gen_ai.usage.input_tokens"] == 12


async def test_an_interrupted_run_ends_its_spans(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    async with open_engine("memory://") as engine:
        instrument(engine, provider)
        run = await engine.start({"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 30}}]},
                                 run_id="cut")
    with pytest.raises(RunError, match="interrupted"):
        await run.wait()
    await asyncio.sleep(0)  # the tracer learns of the interruption in a task of its own, like this test
    spans = exporter.get_finished_spans()
    [run_span] = by_name(spans, "planweave.run")
    [step] = by_name(spans, "step long")
    assert run_span.status.status_code is StatusCode.ERROR and "interrupted" in (run_span.status.description or "")
    assert parent_of(step) == span_id(run_span)


async def test_create_app_adds_no_tracing_listener(journal_url: str) -> None:
    from planweave.server import create_app

    async with open_engine("memory://") as engine:
        create_app(engine, "t" * 20)
        listeners = [getattr(listener, "__self__", listener) for listener in engine._listeners]
        assert listeners and not [x for x in listeners if "telemetry" in type(x).__module__]  # tracing is opt-in
        assert engine.tools is None


def test_tracing_is_off_unless_the_environment_asks() -> None:
    assert not telemetry_from_env({})
    assert not telemetry_from_env({"OTEL_TRACES_EXPORTER": "none"})
    assert telemetry_from_env({"OTEL_TRACES_EXPORTER": "otlp"})
    assert telemetry_from_env({"OTEL_TRACES_EXPORTER": "console,none"})
    assert not telemetry_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})


def test_importing_the_server_does_not_load_the_tracing_code() -> None:
    # (FastAPI itself imports the OpenTelemetry API when it is installed; the SDK and our tracer stay unloaded.)
    code = ("import sys, planweave.server; "
            "print(any(m in sys.modules for m in ('planweave.server.telemetry', 'opentelemetry.sdk.trace')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_provider_follows_the_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "otlp",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    try:
        assert provider.resource.attributes["service.name"] == "planweave"
    finally:
        provider.shutdown()
    provider = tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "none"})
    provider.shutdown()
    with pytest.raises(TelemetryError, match="zipkin"):
        tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TelemetryError, match="protocol"):
        tracer_provider_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


async def test_each_model_calls_admission_is_a_span_under_its_step_attempt(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    from planweave.models.admission import Admission, EndpointLimits
    from planweave.models.openai import OpenAIChatClient
    from planweave.testing import ScriptedLLM, Text
    from planweave.tools.llm import llm_tool

    plan = {"steps": [{"id": "ask", "tool": "llm", "args": {"prompt": "hi", "max_tokens": 8},
                       "estimate": {"duration": 1}}]}
    admission = Admission({"scripted": EndpointLimits(max_concurrency=2)})
    async with (ScriptedLLM(default=Text("hello there")) as base_url,
                OpenAIChatClient("scripted", base_url=base_url, admission=admission) as client,
                open_engine("memory://", tools=Toolbox({"llm": llm_tool(client)})) as engine):
        instrument(engine, provider)
        result = await (await engine.start(plan, run_id="asked", priority=3.0)).wait()
    assert result.ok, result.error
    spans = exporter.get_finished_spans()
    [step] = by_name(spans, "step ask")
    [admitted] = by_name(spans, "model admission scripted")
    assert parent_of(admitted) == span_id(step)
    attributes = dict(admitted.attributes or {})
    assert attributes["planweave.admission.signal"] == "ok" and attributes["planweave.admission.status"] == 200
    assert attributes["planweave.admission.priority"] == 3.0 and attributes["planweave.admission.slack"] == 0.0
    assert attributes["planweave.run_id"] == "asked" and attributes["planweave.admission.purpose"] == "llm_step"
    assert attributes["planweave.admission.waited_s"] == 0.0
