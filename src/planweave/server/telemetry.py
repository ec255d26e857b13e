"""OpenTelemetry traces of runs: a span per run, per step attempt and per tool call, from outside the engine.

The engine knows nothing of OpenTelemetry. :func:`instrument` subscribes a listener to the engine's events (run and
attempt spans) and wraps the engine's tool catalog (tool-call spans, children of the attempt that made the call,
found through :func:`~planweave.core.context.current_step`). Nothing here runs unless :func:`instrument` is
called: ``planweave serve`` calls it only when ``OTEL_TRACES_EXPORTER`` (or a flag) asks for traces.

Span names and attributes follow one of two conventions, chosen by ``OTEL_SEMCONV_STABILITY_OPT_IN`` (the variable
OpenTelemetry instrumentations use to move to new semantic conventions) or ``instrument(semconv=...)``:

- ``gen_ai_latest_experimental`` in it: the OpenTelemetry GenAI conventions (``gen_ai.*``, as
  opentelemetry-semantic-conventions 0.66 names them). ``invoke_workflow <plan>`` (the run: ``gen_ai.operation.name``
  ``invoke_workflow``, ``gen_ai.workflow.name``) → ``execute_tool <tool>`` (one per step attempt: ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id`` ``<step>#<attempt>``, the id AG-UI streams carry too, ``gen_ai.tool.type`` ``function``;
  the tool's call runs inside it, no span of its own) → ``chat <model>`` (each model call a step reports:
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` and
  ``output_tokens``, the cost as ``planweave.cost_usd``). Each planner call is ``invoke_agent planner``
  (``gen_ai.agent.name`` ``planner``, ``planweave.purpose`` plan, replan, repair, join, ...) under the run, with its
  ``chat <model>`` under it; each plan version after the first is a span ``replan`` (``planweave.plan.version``,
  ``planweave.trigger``) linked to the last attempt span of every step it changed (added again, cancelled, dropped or
  adopted). The provider is the model's (``openai/gpt-4o``, or known model families: ``claude-*`` is anthropic,
  ...), else ``openai``: planweave's model client speaks the OpenAI API, and the conventions name the API's provider
  when the real one is not known. Metrics (the meter provider given, else the global one):
  ``gen_ai.client.token.usage`` (``{token}``, per ``gen_ai.token.type``) and ``gen_ai.client.operation.duration``
  (seconds) per model call.
- otherwise the names planweave emitted before, kept so that dashboards and queries built on them keep working (the
  metrics, which did not exist then, are recorded in both modes):

Span tree: ``planweave.run`` → ``step <id>`` (one per attempt) → ``tool <name>``; each model call is a span
``model <model>``; each model call's admission is a
span ``model admission <model>`` (from queueing to the end of the call, a child of its step's attempt when it has
one) with ``planweave.admission.*`` attributes: ``waited_s``, ``signal``, ``status``, ``window``, ``queued``,
``priority``, ``slack``, ``purpose``. Attributes:
``planweave.run_id``, ``planweave.step_id``, ``planweave.tool``, ``planweave.attempt``; a failed attempt or tool
call has status ERROR with the error text, and ``error.type`` set to the failure kind.

Spans leave the process (an exporter ships them to a collector), so every text they carry (name, attribute,
event, status description, a tool's exception with its stack trace) passes through the run's redaction first, the
one that hides secrets in the journal and the API: no tracing call here reaches an SDK span but through
:class:`_SafeSpan`.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, Tracer
    from opentelemetry.util.types import Attributes
except ModuleNotFoundError:  # the OpenTelemetry SDK: name the extra that brings it
    from planweave.extras import require

    require("telemetry", "tracing (--telemetry or the OTEL_* variables)")
    raise

from planweave import __version__
from planweave.core.context import current_step
from planweave.core.errors import PlanweaveError, RunError, RunNotFound
from planweave.core.events import Event
from planweave.core.plan.catalog import ToolCatalog, ToolSpec
from planweave.engine.runtime import Engine, Run
from planweave.models.admission import EndpointScheduler, Outcome, Ticket, add_decision_listener
from planweave.tools.safety import SecretRedactor

__all__ = ["TelemetryError", "instrument", "meter_provider_from_env", "semconv_from_env", "tracer_provider_from_env"]

RUN_ID = "planweave.run_id"
STEP_ID = "planweave.step_id"
TOOL = "planweave.tool"
ATTEMPT = "planweave.attempt"
ERROR_TYPE = "error.type"

#: The conventions spans follow: the GenAI semantic conventions, or the names planweave used before them.
Semconv = Literal["gen_ai_latest_experimental", "planweave"]
GENAI: Semconv = "gen_ai_latest_experimental"
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
COST = "planweave.cost_usd"
PLANNER = "planner"  # gen_ai.agent.name of the planner's calls
#: The providers known model families belong to (the conventions' gen_ai.provider.name values).
_FAMILIES = (("gpt-", "openai"), ("o1", "openai"), ("o3", "openai"), ("o4", "openai"), ("chatgpt", "openai"),
             ("claude", "anthropic"), ("gemini", "gcp.gemini"), ("mistral", "mistral_ai"), ("mixtral", "mistral_ai"),
             ("codestral", "mistral_ai"), ("deepseek", "deepseek"), ("grok", "x_ai"), ("command", "cohere"))


def semconv_from_env(environ: Mapping[str, str] | None = None) -> Semconv:
    """The conventions ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for: the GenAI ones when it lists
    ``gen_ai_latest_experimental``, else planweave's earlier names."""
    env = os.environ if environ is None else environ
    wanted = {part.strip().lower() for part in env.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}
    return GENAI if GENAI in wanted else "planweave"


def provider_of(model: str) -> str:
    """``gen_ai.provider.name`` for ``model``: its ``provider/`` prefix, its family's provider, else ``openai`` (the
    API planweave's model client speaks)."""
    prefix, slash, _ = model.partition("/")
    if slash and prefix:
        return prefix.lower()
    lowered = model.lower()
    return next((provider for family, provider in _FAMILIES if lowered.startswith(family)), "openai")


class TelemetryError(PlanweaveError):
    """The OpenTelemetry environment asks for an exporter planweave cannot set up."""


Redact = Callable[[Any], Any]


class _SafeSpan:
    """An SDK span whose every text passes through ``redact`` before it is recorded (what exporters ship)."""

    __slots__ = ("_redact", "excepted", "span")

    def __init__(self, span: Span, redact: Redact) -> None:
        self.span = span  # the SDK's span: for contexts (parents) only, never to record text on
        self._redact = redact
        self.excepted = False  # an exception was recorded on it (with its stack trace)

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, self._redact(value))

    def add_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        self.span.add_event(self._redact(name), _redacted(attributes, self._redact))

    def set_status(self, status: Status) -> None:
        description = status.description
        self.span.set_status(Status(status.status_code, self._redact(description) if description else None))

    def record_exception(self, exc: BaseException) -> None:
        """The SDK's ``exception`` event (type, message, stack trace), with its texts redacted: the SDK's own
        ``record_exception`` would record the message and the trace as they are."""
        kind = type(exc)
        name = kind.__qualname__
        if kind.__module__ not in ("builtins", "__main__"):
            name = f"{kind.__module__}.{name}"
        self.add_event("exception", {"exception.type": name, "exception.message": str(exc),
                                     "exception.stacktrace": "".join(traceback.format_exception(exc)),
                                     "exception.escaped": False})
        self.excepted = True

    def end(self, end_time: int | None = None) -> None:
        self.span.end(end_time=end_time)


def _redacted(attributes: Mapping[str, Any] | None, redact: Redact) -> Attributes:
    return {key: redact(value) for key, value in (attributes or {}).items()}


class _SafeTracer:
    """A tracer whose spans are :class:`_SafeSpan`: names and attributes redacted from the start."""

    def __init__(self, tracer: Tracer, redact: Redact) -> None:
        self._tracer = tracer
        self._redact = redact

    def start_span(self, name: str, context: otel_context.Context | None = None,
                   attributes: Mapping[str, Any] | None = None, start_time: int | None = None,
                   links: Iterable[SpanContext] = ()) -> _SafeSpan:
        span = self._tracer.start_span(self._redact(name), context=context,
                                       attributes=_redacted(attributes, self._redact), start_time=start_time,
                                       links=[Link(link) for link in links])
        return _SafeSpan(span, self._redact)


class _GenAiMetrics:
    """The GenAI client metrics of the model calls runs report: token usage and operation duration."""

    def __init__(self, meter: metrics.Meter, redact: Redact) -> None:
        self._redact = redact
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=[4.0 ** i for i in range(14)])  # 1 ... 67,108,864
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                                 20.48, 40.96, 81.92])

    def model_call(self, attributes: Mapping[str, Any], input_tokens: int, output_tokens: int,
                   seconds: float | None) -> None:
        shown = _redacted(attributes, self._redact)
        self._tokens.record(input_tokens, {**(shown or {}), "gen_ai.token.type": "input"})
        self._tokens.record(output_tokens, {**(shown or {}), "gen_ai.token.type": "output"})
        if seconds is not None:
            self._duration.record(seconds, shown)


class _RunTracing:
    """The open spans of the engine's runs, driven by its events (the engine's listener)."""

    def __init__(self, engine: Engine, tracer: _SafeTracer, semconv: Semconv, meters: _GenAiMetrics) -> None:
        self._engine = engine
        self._tracer = tracer
        self.genai = semconv == GENAI
        self._meters = meters
        self._runs: dict[str, _SafeSpan] = {}
        self._attempts: dict[tuple[str, str], _SafeSpan] = {}
        self._last_attempts: dict[tuple[str, str], SpanContext] = {}  # for the links of re-plans (GenAI)
        self._watchers: set[asyncio.Future[None]] = set()

    # -- spans the tool wrapper needs ---------------------------------------------------------------------------
    def attempt_span(self, run_id: str, step_id: str) -> Span | None:
        """The span of the attempt of ``step_id`` that is running now, if any (to parent spans on)."""
        found = self._attempts.get((run_id, step_id))
        return found.span if found is not None else None

    def attempt(self, run_id: str, step_id: str) -> _SafeSpan | None:
        """The (redacting) span of the attempt of ``step_id`` running now, if any: a GenAI tool call records on it."""
        return self._attempts.get((run_id, step_id))

    @property
    def tracer(self) -> _SafeTracer:
        return self._tracer

    # -- the listener --------------------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        """Open and close spans as the run's events say (called by the engine, synchronously, for every event)."""
        kind = event.kind
        if kind == "step_started":
            self._start_attempt(event)
        elif kind == "step_succeeded":
            self._end_attempt(event.run_id, event.step, None)
        elif kind == "step_failed":
            self._fail_attempt(event)
        elif kind == "step_cancelled":
            self._end_attempt(event.run_id, event.step, "cancelled")
        elif kind in ("run_created", "run_resumed"):
            self._start_run(event)
        elif kind == "run_cancelled":
            for run_id, step_id in [key for key in self._attempts if key[0] == event.run_id]:
                self._end_attempt(run_id, step_id, "cancelled")
        elif kind == "run_finished":
            self._end_run(event.run_id, str(event.data.get("status")), event.data.get("error"))
        elif kind == "model_call":
            self._model_call(event)
        elif kind in ("plan_version", "steps_added", "escalation"):
            self._run_event(event)
            if kind == "plan_version" and self.genai and event.data.get("parent") is not None:
                self._replan(event)

    def _run(self, run_id: str) -> Run | None:
        try:
            return self._engine.get(run_id)
        except RunNotFound:
            return None

    def _start_run(self, event: Event) -> None:
        self._end_run(event.run_id, "interrupted", "the run was started again before its span ended")
        run = self._run(event.run_id)
        attributes: dict[str, Any] = {RUN_ID: event.run_id, "planweave.resumed": event.kind == "run_resumed"}
        name = "planweave.run"
        if run is not None:
            attributes["planweave.plan"] = run.plan.spec.name
            attributes["planweave.steps"] = len(run.plan)
        if self.genai:
            attributes[OPERATION] = "invoke_workflow"
            workflow = run.plan.spec.name if run is not None else None
            name = f"invoke_workflow {workflow}" if workflow else "invoke_workflow"
            if workflow:
                attributes["gen_ai.workflow.name"] = workflow
        # A root span: a run outlives the request (or command) that started it.
        self._runs[event.run_id] = self._tracer.start_span(name, context=otel_context.Context(), attributes=attributes)
        if run is not None:
            self._watch(run)

    def _watch(self, run: Run) -> None:
        """Close the spans of a run that is interrupted (the engine closed): it emits no ``run_finished`` then."""

        async def follow() -> None:
            try:
                await run.wait()
            except RunError:
                self._end_run(run.id, "interrupted", "the run was interrupted; resume it to continue")

        self._watchers.add(task := asyncio.ensure_future(follow()))
        task.add_done_callback(self._watchers.discard)

    def _start_attempt(self, event: Event) -> None:
        assert event.step is not None
        parent = self._runs.get(event.run_id)
        run = self._run(event.run_id)
        attempt = int(event.data.get("attempt", 1))
        attributes: dict[str, Any] = {RUN_ID: event.run_id, STEP_ID: event.step, ATTEMPT: attempt}
        if run is not None and event.step in run.plan.steps:
            step = run.plan.steps[event.step]
            rec = run.state.records.get(event.step)
            on_fallback = rec is not None and rec.fallback_active and step.fallback is not None
            attributes[TOOL] = step.fallback.tool if on_fallback and step.fallback is not None else step.tool
        name = f"step {event.step}"
        if self.genai:
            tool = str(attributes.get(TOOL, "unknown"))
            name = f"execute_tool {tool}"
            attributes.update({OPERATION: "execute_tool", TOOL_NAME: tool, TOOL_CALL_ID: f"{event.step}#{attempt}",
                               "gen_ai.tool.type": "function"})
        context = trace.set_span_in_context(parent.span) if parent is not None else otel_context.Context()
        span = self._tracer.start_span(name, context=context, attributes=attributes)
        self._attempts[(event.run_id, event.step)] = span
        if self.genai:
            self._last_attempts[(event.run_id, event.step)] = span.span.get_span_context()

    def _model_call(self, event: Event) -> None:
        """A span for a model call the run reported, with its own times (it happened before the event); under the
        GenAI conventions a planner's call (no step) is an ``invoke_agent planner`` span around it."""
        data = event.data
        model = str(data.get("model") or "")
        input_tokens = int(data.get("prompt_tokens", 0) or 0)
        output_tokens = int(data.get("completion_tokens", 0) or 0)
        started, finished = data.get("started_at"), data.get("finished_at")
        start, end = _epoch_ns(started), _epoch_ns(finished)
        parent = self._attempts.get((event.run_id, event.step)) if event.step else None
        parent = parent or self._runs.get(event.run_id)
        attributes: dict[str, Any] = {RUN_ID: event.run_id, REQUEST_MODEL: model, INPUT_TOKENS: input_tokens,
                                      OUTPUT_TOKENS: output_tokens, COST: float(data.get("cost_usd", 0.0) or 0.0)}
        if event.step:
            attributes[STEP_ID] = event.step
        if data.get("purpose"):
            attributes["planweave.purpose"] = str(data["purpose"])
        measured = {OPERATION: "chat", PROVIDER: provider_of(model), REQUEST_MODEL: model, RESPONSE_MODEL: model}
        seconds = (float(finished) - float(started) if isinstance(started, int | float)
                   and isinstance(finished, int | float) and finished >= started else None)
        self._meters.model_call(measured, input_tokens, output_tokens, seconds)
        context = trace.set_span_in_context(parent.span) if parent is not None else otel_context.Context()
        if not self.genai:
            span = self._tracer.start_span(f"model {model}".strip(), context=context, attributes=attributes,
                                           start_time=start)
            span.end(end_time=end)
            return
        attributes.update(measured)
        planner: _SafeSpan | None = None
        if not event.step:  # the planner's call (plan, replan, repair, join, ...): an agent invocation
            planner = self._tracer.start_span(
                f"invoke_agent {PLANNER}", context=context, start_time=start,
                attributes={RUN_ID: event.run_id, OPERATION: "invoke_agent", "gen_ai.agent.name": PLANNER,
                            PROVIDER: measured[PROVIDER], REQUEST_MODEL: model,
                            "planweave.purpose": str(data.get("purpose") or "plan")})
            context = trace.set_span_in_context(planner.span)
        span = self._tracer.start_span(f"chat {model}".strip(), context=context, attributes=attributes,
                                       start_time=start)
        span.end(end_time=end)
        if planner is not None:
            planner.end(end_time=end)

    def _replan(self, event: Event) -> None:
        """A ``replan`` span for a new plan version, linked to the last attempts of the steps it changed."""
        data = event.data
        changed = [sid for part in ("added", "cancelled", "dropped", "adopted") for sid in data.get(part, ())]
        links = [found for sid in dict.fromkeys(changed)
                 if (found := self._last_attempts.get((event.run_id, sid))) is not None]
        parent = self._runs.get(event.run_id)
        context = trace.set_span_in_context(parent.span) if parent is not None else otel_context.Context()
        attributes: dict[str, Any] = {RUN_ID: event.run_id, "planweave.plan.version": int(data.get("version", 0)),
                                      "planweave.trigger": str(data.get("trigger", "replan"))}
        if data.get("parent") is not None:
            attributes["planweave.plan.parent"] = int(data["parent"])
        for part in ("added", "cancelled", "dropped", "adopted"):
            attributes[f"planweave.plan.{part}"] = [str(sid) for sid in data.get(part, ())]
        self._tracer.start_span("replan", context=context, attributes=attributes, links=links).end()

    def _run_event(self, event: Event) -> None:
        span = self._runs.get(event.run_id)
        if span is None:
            return
        data = event.data
        attributes = {k: str(data[k]) for k in ("version", "parent", "trigger", "rung", "reason") if data.get(k)}
        if event.step:
            attributes[STEP_ID] = event.step
        span.add_event(event.kind, attributes)

    def _fail_attempt(self, event: Event) -> None:
        span = self._attempts.pop((event.run_id, event.step or ""), None)
        if span is None:
            return
        error = str(event.data.get("error", "failed"))
        kind = str(event.data.get("kind", "error"))
        span.set_attribute(ERROR_TYPE, kind)
        span.set_attribute("planweave.final", bool(event.data.get("final", True)))
        if "retry_in" in event.data:
            span.set_attribute("planweave.retry_in", float(event.data["retry_in"]))
        if not span.excepted:  # a GenAI attempt has its tool's exception, stack trace and all, already
            span.add_event("exception", {"exception.type": kind, "exception.message": error})
        span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def _end_attempt(self, run_id: str, step_id: str | None, outcome: str | None) -> None:
        span = self._attempts.pop((run_id, step_id or ""), None)
        if span is None:
            return
        if outcome is None:
            span.set_status(Status(StatusCode.OK))
        else:
            span.set_attribute("planweave.outcome", outcome)
        span.end()

    def _end_run(self, run_id: str, status: str, error: Any) -> None:
        for key in [key for key in self._attempts if key[0] == run_id]:
            self._end_attempt(key[0], key[1], status if status != "succeeded" else "unfinished")
        for key in [key for key in self._last_attempts if key[0] == run_id]:
            del self._last_attempts[key]
        span = self._runs.pop(run_id, None)
        if span is None:
            return
        span.set_attribute("planweave.status", status)
        if status == "succeeded":
            span.set_status(Status(StatusCode.OK))
        else:
            span.set_status(Status(StatusCode.ERROR, str(error) if error else status))
        span.end()


def _epoch_ns(at: Any) -> int | None:
    """Seconds since the epoch as nanoseconds; None (use now) for anything else, e.g. virtual-clock times."""
    if isinstance(at, int | float) and at >= 1e9:
        return int(at * 1e9)
    return None


class _TracedTool:
    """A tool whose calls are spans, children of the span of the step attempt that makes them."""

    def __init__(self, inner: ToolSpec, tracing: _RunTracing) -> None:
        self._inner = inner
        self._tracing = tracing

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def description(self) -> str:
        return self._inner.description

    @property
    def idempotent(self) -> bool:
        return self._inner.idempotent

    @property
    def input_schema(self) -> Mapping[str, Any]:
        return self._inner.input_schema

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        return self._inner.check_args(args, deferred)

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Call the tool inside a ``tool <name>`` span (the current span while it runs, for nested tracing); under the
        GenAI conventions inside its attempt's ``execute_tool`` span, or one of its own outside any step."""
        attributes: dict[str, Any] = {TOOL: self.name}
        parent: Span | None = None
        try:
            step = current_step()
        except LookupError:
            pass
        else:
            attributes.update({RUN_ID: step.run_id, STEP_ID: step.step_id, ATTEMPT: step.attempt})
            if self._tracing.genai and (attempt := self._tracing.attempt(step.run_id, step.step_id)) is not None:
                return await self._within(attempt, args)
            parent = self._tracing.attempt_span(step.run_id, step.step_id)
        context = trace.set_span_in_context(parent) if parent is not None else None
        name = f"tool {self.name}"
        if self._tracing.genai:
            name = f"execute_tool {self.name}"
            attributes.update({OPERATION: "execute_tool", TOOL_NAME: self.name, "gen_ai.tool.type": "function"})
        span = self._tracing.tracer.start_span(name, context=context, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span.span))
        try:
            return await self._inner.invoke(args)
        except asyncio.CancelledError:
            span.set_attribute("planweave.outcome", "cancelled")
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_attribute(ERROR_TYPE, getattr(exc, "kind", type(exc).__name__))
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            otel_context.detach(token)
            span.end()

    async def _within(self, attempt: _SafeSpan, args: Mapping[str, Any]) -> Any:
        """The call as part of its attempt's ``execute_tool`` span: current while it runs, its exception recorded
        there (the attempt's events end the span)."""
        token = otel_context.attach(trace.set_span_in_context(attempt.span))
        try:
            return await self._inner.invoke(args)
        except Exception as exc:
            attempt.record_exception(exc)
            raise
        finally:
            otel_context.detach(token)


class _TracedCatalog(Mapping[str, ToolSpec]):
    """The engine's tool catalog with every tool wrapped in :class:`_TracedTool`."""

    def __init__(self, inner: ToolCatalog, tracing: _RunTracing) -> None:
        self._inner = inner
        self._tracing = tracing
        self._wrapped: dict[str, tuple[ToolSpec, _TracedTool]] = {}

    def __getitem__(self, name: str) -> ToolSpec:
        tool = self._inner[name]
        cached = self._wrapped.get(name)
        if cached is None or cached[0] is not tool:
            cached = self._wrapped[name] = (tool, _TracedTool(tool, self._tracing))
        return cached[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._inner)

    def __len__(self) -> int:
        return len(self._inner)


def instrument(engine: Engine, tracer_provider: trace.TracerProvider | None = None,
               meter_provider: metrics.MeterProvider | None = None, *, semconv: Semconv | None = None) -> None:
    """Trace ``engine``'s runs: call before starting them (the listener sees runs started after this call).

    Spans go to ``tracer_provider`` (default: the global one, see :func:`opentelemetry.trace.set_tracer_provider`),
    the GenAI metrics to ``meter_provider`` (default: the global one); ``semconv`` names the conventions they
    follow (default: :func:`semconv_from_env`).
    Tool calls are traced for runs that use the engine's catalog (not for runs started with their own ``tools=``).
    Every text of a span is redacted as the engine's runs redact what they journal (``Engine(redact=...)``); an
    engine without a redaction still gets this process's secret variables hidden (:class:`SecretRedactor`).
    """
    redact: Redact = engine.redact if engine.redact is not None else SecretRedactor()
    tracer = _SafeTracer(trace.get_tracer("planweave", __version__, tracer_provider=tracer_provider), redact)
    meters = _GenAiMetrics(metrics.get_meter("planweave", __version__, meter_provider=meter_provider), redact)
    tracing = _RunTracing(engine, tracer, semconv if semconv is not None else semconv_from_env(), meters)
    engine.subscribe(tracing.on_event)
    if engine.tools is None:
        from planweave.tools import builtin_tools  # what the engine would use by default

        engine.tools = builtin_tools()
    engine.tools = _TracedCatalog(engine.tools, tracing)
    for remove in _ADMISSION_LISTENERS:  # one engine traced per process: the latest instrument() wins
        remove()
    _ADMISSION_LISTENERS[:] = [add_decision_listener(_AdmissionTracing(tracing).on_decision)]


_ADMISSION_LISTENERS: list[Callable[[], None]] = []


class _AdmissionTracing:
    """Model-call admission decisions as spans (a listener of every endpoint scheduler of the process)."""

    def __init__(self, tracing: _RunTracing) -> None:
        self._tracing = tracing

    def on_decision(self, endpoint: EndpointScheduler, what: str, ticket: Ticket, outcome: Outcome | None) -> None:
        if what != "finished":
            return
        now = asyncio.get_running_loop().time()
        end = time.time_ns()
        start = end - int(max(0.0, now - ticket.enqueued_at) * 1e9)
        call = ticket.call
        parent = (self._tracing.attempt_span(call.run_id, call.step_id)
                  if call.run_id is not None and call.step_id is not None else None)
        context = trace.set_span_in_context(parent) if parent is not None else None
        stats = endpoint.policy
        attributes: dict[str, Any] = {
            "planweave.admission.endpoint": endpoint.name, "planweave.admission.waited_s": ticket.waited or 0.0,
            "planweave.admission.signal": ticket.signal or "failed",
            "planweave.admission.window": stats.window, "planweave.admission.queued": stats.queued,
            "planweave.admission.priority": call.priority, "planweave.admission.purpose": call.purpose,
        }
        if outcome is not None and outcome.status is not None:
            attributes["planweave.admission.status"] = outcome.status
        if call.slack is not None:
            attributes["planweave.admission.slack"] = call.slack
        if call.run_id is not None:
            attributes[RUN_ID] = call.run_id
        span = self._tracing.tracer.start_span(f"model admission {endpoint.model}", context=context,
                                                start_time=start, attributes=attributes)
        span.end(end_time=end)


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                    or "http/protobuf").strip().lower()
        if protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                    OTLPSpanExporter as GrpcExporter,
                )
            except ImportError:
                raise TelemetryError(
                    "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package opentelemetry-exporter-otlp-proto-grpc; "
                    "install it, or use http/protobuf (the default)"
                ) from None
            exporter: SpanExporter = GrpcExporter()
            return exporter
        if protocol != "http/protobuf":
            raise TelemetryError(f"OTLP protocol '{protocol}' is not supported: use http/protobuf or grpc")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT itself
    raise TelemetryError(f"OTEL_TRACES_EXPORTER names '{name}': planweave supports otlp, console and none")


def _otlp_protocol(env: Mapping[str, str], signal: str) -> str:
    protocol = (env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise TelemetryError(f"OTLP protocol '{protocol}' is not supported: use http/protobuf or grpc")
    return protocol


def _metric_exporter(name: str, env: Mapping[str, str]) -> MetricExporter:
    if name == "console":
        return ConsoleMetricExporter()
    if name != "otlp":
        raise TelemetryError(f"OTEL_METRICS_EXPORTER names '{name}': planweave supports otlp, console and none")
    if _otlp_protocol(env, "METRICS") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found]
                OTLPMetricExporter as GrpcExporter,
            )
        except ImportError:
            raise TelemetryError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package opentelemetry-exporter-otlp-proto-grpc; "
                "install it, or use http/protobuf (the default)"
            ) from None
        exporter: MetricExporter = GrpcExporter()
        return exporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()  # reads OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT, _HEADERS, _TIMEOUT itself


def _resource() -> Resource:
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "planweave"}))
    return resource


def meter_provider_from_env(environ: Mapping[str, str] | None = None) -> MeterProvider | None:
    """A meter provider for the GenAI metrics when ``OTEL_METRICS_EXPORTER`` names an exporter (otlp, console;
    comma-separated), else None: metrics are opt-in, so a collector that takes only traces gets nothing new. Export
    every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (the SDK reads it); shut it down at exit. Raises :class:`TelemetryError`.
    """
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in env.get("OTEL_METRICS_EXPORTER", "").split(",") if n.strip()]
    readers = [PeriodicExportingMetricReader(_metric_exporter(name, env)) for name in names if name != "none"]
    return MeterProvider(resource=_resource(), metric_readers=readers) if readers else None


def tracer_provider_from_env(environ: Mapping[str, str] | None = None) -> TracerProvider:
    """A tracer provider set up from the standard variables: ``OTEL_TRACES_EXPORTER`` (otlp, console, none;
    comma-separated), ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends, ``OTEL_SERVICE_NAME`` (default ``planweave``),
    ``OTEL_RESOURCE_ATTRIBUTES``. Shut it down at exit to send the last spans. Raises :class:`TelemetryError`.
    """
    env = os.environ if environ is None else environ
    provider = TracerProvider(resource=_resource())
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    for name in names:
        if name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
    return provider
