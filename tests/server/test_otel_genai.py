"""OpenTelemetry GenAI semantic conventions (``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``): the run
as ``invoke_workflow``, each attempt as ``execute_tool``, each model call as ``chat`` with the usage, planner calls as
``invoke_agent planner``, re-plans linked to the steps they changed, and the GenAI client metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from planweave import Toolbox, ToolError, builtin_tools, current_step, open_engine
from planweave.server.telemetry import (
    TelemetryError,
    instrument,
    meter_provider_from_env,
    provider_of,
    semconv_from_env,
)
from tests.timing import step_is, until

SECRET = "sk-genai-0123456789abcdefSECRET"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meters(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


def toolbox(gate: asyncio.Event | None = None) -> Toolbox:
    box = builtin_tools()

    async def explode(message: str) -> None:
        """Always fails."""
        raise ToolError(message, kind="boom")

    async def think(prompt: str) -> str:
        """Pretends to call a model and reports its usage."""
        current_step().report_usage({"model": "claude-tiny", "prompt_tokens": 12, "completion_tokens": 3,
                                     "cost_usd": 0.0001, "purpose": "test", "started_at": 1.8e9,
                                     "finished_at": 1.8e9 + 0.25})
        return prompt.upper()

    async def wait() -> None:
        """Waits for the test's gate."""
        if gate is not None:
            await gate.wait()

    box.add(explode)
    box.add(think, idempotent=True)
    box.add(wait, idempotent=True)
    return box


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


PLAN: dict[str, Any] = {"name": "report", "steps": [
    {"id": "a", "tool": "noop", "args": {"x": 1}},
    {"id": "b", "tool": "explode", "args": {"message": "it broke"}, "retries": {"max": 1, "backoff": 0}},
    {"id": "d", "tool": "think", "args": {"prompt": "hi"}},
]}


async def test_spans_follow_the_genai_conventions(
    provider: TracerProvider, exporter: InMemorySpanExporter, meters: MeterProvider,
) -> None:
    async with open_engine("memory://", tools=toolbox()) as engine:
        instrument(engine, provider, meters, semconv="gen_ai_latest_experimental")
        result = await (await engine.start(PLAN, run_id="g1")).wait()
    assert result.status == "failed"
    spans = exporter.get_finished_spans()

    [run] = named(spans, "invoke_workflow report")
    assert run.parent is None
    assert attrs(run)["gen_ai.operation.name"] == "invoke_workflow" and attrs(run)["gen_ai.workflow.name"] == "report"
    assert run.status.status_code is StatusCode.ERROR

    [a] = named(spans, "execute_tool noop")
    assert parent_of(a) == span_id(run)
    assert {k: v for k, v in attrs(a).items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "noop", "gen_ai.tool.call.id": "a#1",
        "gen_ai.tool.type": "function"}
    attempts = sorted(named(spans, "execute_tool explode"), key=lambda s: str(attrs(s)["gen_ai.tool.call.id"]))
    assert [attrs(s)["gen_ai.tool.call.id"] for s in attempts] == ["b#1", "b#2"]
    for attempt in attempts:
        assert parent_of(attempt) == span_id(run)
        assert attempt.status.status_code is StatusCode.ERROR and attrs(attempt)["error.type"] == "boom"
        [exception] = [e for e in attempt.events if e.name == "exception"]  # the tool's, with its stack trace
        assert "exception.stacktrace" in (exception.attributes or {})
    assert not [s for s in spans if s.name.startswith(("tool ", "step ", "model ", "planweave.run"))]

    [think] = named(spans, "execute_tool think")
    [chat] = named(spans, "chat claude-tiny")
    assert parent_of(chat) == span_id(think)
    assert {k: v for k, v in attrs(chat).items() if k.startswith(("gen_ai.", "planweave.cost"))} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-tiny", "gen_ai.response.model": "claude-tiny",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3, "planweave.cost_usd": 0.0001}
    assert chat.start_time == int(1.8e9 * 1e9) and chat.end_time == int((1.8e9 + 0.25) * 1e9)


async def test_the_genai_client_metrics_count_tokens_and_time_per_model_call(
    provider: TracerProvider, meters: MeterProvider, reader: InMemoryMetricReader,
) -> None:
    async with open_engine("memory://", tools=toolbox()) as engine:
        instrument(engine, provider, meters, semconv="planweave")  # metrics in either convention
        await (await engine.start(PLAN, run_id="g2")).wait()
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[HistogramDataPoint]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(p for p in metric.data.data_points
                                                          if isinstance(p, HistogramDataPoint))
    tokens = {str((p.attributes or {})["gen_ai.token.type"]): p for p in points["gen_ai.client.token.usage"]}
    assert tokens["input"].sum == 12 and tokens["output"].sum == 3
    assert dict(tokens["input"].attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-tiny",
        "gen_ai.response.model": "claude-tiny", "gen_ai.token.type": "input"}
    [duration] = points["gen_ai.client.operation.duration"]
    assert duration.count == 1 and duration.sum == pytest.approx(0.25)


async def test_planner_calls_are_agent_invocations_and_a_replan_links_the_steps_it_changed(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
    monkeypatch.setenv("UPSTREAM_API_KEY", SECRET)
    gate = asyncio.Event()
    plan = {"steps": [{"id": "a", "tool": "noop"}, {"id": "slow", "tool": "wait", "after": ["a"]},
                      {"id": "later", "tool": "noop", "after": ["slow"]}]}
    async with open_engine("memory://", tools=toolbox(gate)) as engine:
        instrument(engine, provider)  # the conventions from the environment
        run = await engine.start(plan, run_id="g3", hold=True)
        await until(run, step_is("slow", "running"), "slow running")
        run.record("model_call", {"purpose": "replan", "model": "gpt-4o-mini", "prompt_tokens": 100,
                                  "completion_tokens": 20, "cost_usd": 0.001, "started_at": 1.8e9,
                                  "finished_at": 1.8e9 + 1})
        run.propose({"steps": [{"id": "a", "tool": "noop"}, {"id": "fresh", "tool": "noop", "after": ["a"],
                                                            "args": {"note": SECRET}}]})
        run.release()
        result = await run.wait()
    assert result.ok, result.error
    spans = exporter.get_finished_spans()
    [run_span] = [s for s in spans if s.name.startswith("invoke_workflow")]
    [planner] = named(spans, "invoke_agent planner")
    [chat] = named(spans, "chat gpt-4o-mini")
    assert parent_of(planner) == span_id(run_span) and parent_of(chat) == span_id(planner)
    assert attrs(planner)["gen_ai.agent.name"] == "planner" and attrs(planner)["planweave.purpose"] == "replan"
    assert attrs(chat)["gen_ai.provider.name"] == "openai"

    [replan] = named(spans, "replan")
    [slow] = named(spans, "execute_tool wait")
    assert parent_of(replan) == span_id(run_span)
    assert attrs(replan)["planweave.plan.version"] == 2 and attrs(replan)["planweave.plan.cancelled"] == ("slow",)
    assert attrs(replan)["planweave.plan.dropped"] == ("later",)
    assert [link.context.span_id for link in replan.links] == [span_id(slow)]  # later never ran: nothing to link
    assert all(SECRET not in s.to_json(indent=None) for s in spans)


def test_the_conventions_follow_otel_semconv_stability_opt_in() -> None:
    assert semconv_from_env({}) == "planweave"
    assert semconv_from_env({"OTEL_SEMCONV_STABILITY_OPT_IN": "http"}) == "planweave"
    assert semconv_from_env({"OTEL_SEMCONV_STABILITY_OPT_IN": "http,gen_ai_latest_experimental"}) == \
        "gen_ai_latest_experimental"


def test_the_provider_is_the_models_or_the_api_planweave_speaks() -> None:
    assert provider_of("anthropic/claude-3") == "anthropic"
    assert provider_of("gpt-4o-mini") == "openai"
    assert provider_of("claude-3-5-haiku") == "anthropic"
    assert provider_of("Mistral-Large") == "mistral_ai"
    assert provider_of("qwen2.5:7b") == "openai"


def test_metrics_leave_the_process_only_when_otel_metrics_exporter_asks() -> None:
    assert meter_provider_from_env({}) is None
    assert meter_provider_from_env({"OTEL_METRICS_EXPORTER": "none"}) is None
    for exporter in ("console", "otlp"):
        provider = meter_provider_from_env({"OTEL_METRICS_EXPORTER": exporter,
                                            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
        assert provider is not None
        provider.shutdown()
    with pytest.raises(TelemetryError, match="prometheus"):
        meter_provider_from_env({"OTEL_METRICS_EXPORTER": "prometheus"})
    with pytest.raises(TelemetryError, match="protocol"):
        meter_provider_from_env({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"})
