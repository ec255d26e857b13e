"""OpenTelemetry spans hide the run's secrets as its journal does: in attributes, events, status descriptions and
the exceptions tool calls record (an exporter ships spans to another system, where nothing redacts them)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from planweave import Toolbox, builtin_tools, current_step, open_engine
from planweave.server.telemetry import instrument
from planweave.tools.safety import SecretRedactor

SECRET = "sk-h26-0123456789abcdefSECRET"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.setenv("UPSTREAM_API_KEY", SECRET)
    yield InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def leaky_tools() -> Toolbox:
    box = builtin_tools()

    async def upstream(query: str) -> None:
        """Fails the way a client library does: the key it was given in the message."""
        raise RuntimeError(f"upstream said: bad key {SECRET} for {query}")

    async def think(prompt: str) -> str:
        """Reports a model call whose model and purpose carry the secret."""
        current_step().report_usage({"model": f"m-{SECRET}", "prompt_tokens": 1, "completion_tokens": 1,
                                     "cost_usd": 0.0, "purpose": f"p-{SECRET}"})
        return prompt

    box.add(upstream)
    box.add(think, idempotent=True)
    return box


def everything_in(span: ReadableSpan) -> str:
    """The span as an exporter sees it: name, attributes, events, links, status (the SDK's own JSON form)."""
    text: str = span.to_json(indent=None)
    return text


async def test_no_span_carries_a_secret_of_the_environment(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    plan = {"name": f"plan {SECRET}", "steps": [
        {"id": "think", "tool": "think", "args": {"prompt": "hi"}},
        {"id": "call", "tool": "upstream", "args": {"query": "weather"}, "after": ["think"]},
    ]}
    async with open_engine("memory://", tools=leaky_tools(), redact=SecretRedactor()) as engine:
        instrument(engine, provider)
        result = await (await engine.start(plan, run_id="leaky")).wait()
        failed = [e.data for e in await engine.journal.read("leaky", kind="step_failed")]
    assert result.status == "failed"
    assert "bad key ***" in json.dumps(failed)  # the journal hides it: the spans must too

    spans = exporter.get_finished_spans()
    names = {s.name for s in spans}
    assert {"planweave.run", "step call", "tool upstream", "tool think"} <= names
    [call] = [s for s in spans if s.name == "tool upstream"]
    assert call.status.status_code is StatusCode.ERROR
    assert "upstream said: bad key *** for weather" in (call.status.description or "")
    [exception] = [e for e in call.events if e.name == "exception"]
    assert "bad key ***" in str((exception.attributes or {})["exception.message"])
    assert "exception.stacktrace" in (exception.attributes or {})
    for span in spans:
        assert SECRET not in everything_in(span), span.name
