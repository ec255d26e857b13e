"""Model clients: the small :class:`ModelClient` interface, its request and result types, and :func:`resolve_model`.

A client turns a :class:`CompletionRequest` (chat messages, limits, an optional JSON schema) into a
:class:`Completion` (text, parsed JSON, tool calls, token usage and cost), either at once
(:meth:`ModelClient.complete`) or as a stream of :class:`Delta` items ending with the :class:`Completion`
(:meth:`ModelClient.stream`). Implementations, one per dialect (a model name's prefix says which:
:mod:`planweave.models.dialects`): :class:`planweave.models.openai.OpenAIChatClient` for any OpenAI-compatible Chat
Completions endpoint (also the local model, :mod:`planweave.models.local`),
:class:`planweave.models.openai_responses.OpenAIResponsesClient` for the Responses API and
:class:`planweave.models.anthropic.AnthropicClient` for Anthropic Messages; the scripted test server
(:mod:`planweave.testing.scripted_llm`) speaks all three.

The data types and the protocol live in :mod:`planweave.models.base`; this package re-exports them (import them
from here) and imports no HTTP library until :func:`resolve_model` runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from planweave.models.admission import (
    Admission,
    CallClass,
    EndpointLimits,
    EndpointStats,
    call_context,
    load_model_limits,
)
from planweave.models.base import (
    Chunk,
    Completion,
    CompletionRequest,
    Delta,
    Message,
    ModelClient,
    Role,
    StructuredMode,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageSource,
    check_schema,
)
from planweave.models.budget import Budget, Reservation, StreamMeter, acquire_call
from planweave.models.dialects import Dialect, client_class, dialect_of, split_model
from planweave.models.endpoint import Endpoint, EndpointError, RoutedClient, parse_headers
from planweave.models.errors import (
    BudgetExceeded,
    CallRefused,
    LocalModelUnavailable,
    MalformedOutput,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
    RateLimited,
)
from planweave.models.pricing import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_TOKENS,
    Price,
    PriceTable,
    approx_prompt_tokens,
    approx_tokens,
    worst_case,
)


@asynccontextmanager
async def resolve_model(name: str, *, endpoint: Endpoint | None = None, **options: Any) -> AsyncIterator[ModelClient]:
    """Open a client for a ``--model`` name: ``local`` starts the bundled local model server, ``scripted:FILE``
    serves a script's answers on 127.0.0.1 (offline planning, no model: docs/offline.md), anything else is a
    model at ``endpoint`` (its base URL, key and headers) in the dialect its name says
    (:mod:`planweave.models.dialects`): ``anthropic:claude-...`` Anthropic Messages (unset parts:
    ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``), ``openai-responses:gpt-...`` the OpenAI Responses API, else
    Chat Completions (``openai:`` or no prefix; unset parts: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``).
    Keyword ``options`` go to the client; ``admission`` defaults to the process's, see
    :func:`planweave.models.admission.default_admission`. Closes it all on exit. Raises
    :class:`~planweave.models.endpoint.EndpointError` when the endpoint's ``api_key_env`` is unset."""
    from planweave.models.admission import default_admission
    from planweave.models.openai import OpenAIChatClient

    if endpoint is not None and name != "local" and not name.startswith("scripted:"):
        options = {**options, **endpoint.client_options()}

    if "admission" not in options and name != "local":
        options["admission"] = default_admission()  # --model-limits / $PLANWEAVE_MODEL_LIMITS, shared by all
    if name.startswith("scripted:"):  # offline planning: answers read from a script file (docs/offline.md)
        from planweave.testing.scripted_llm import ScriptedLLM
        from planweave.testing.scripted_planner import ScriptedPlanner

        planner = ScriptedPlanner.load(name.removeprefix("scripted:"))
        options = {k: v for k, v in options.items() if k not in ("base_url", "api_key")}
        async with ScriptedLLM(planner.reply, models=(name,)) as url, OpenAIChatClient(
                name, base_url=url, api_key="offline", **options) as client:
            yield client
        return
    if name == "local":
        from planweave.models.local import local_client

        async with local_client(**options) as client:
            yield client
        return
    async with client_class(name)(name, **options) as client:
        yield client


async def open_routes(stack: AsyncExitStack, client: ModelClient, endpoints: Mapping[str, Endpoint],
                      base: Endpoint | None = None, **options: Any) -> ModelClient:
    """``client``, or when some models have an endpoint of their own (a tier table's ``base_url``, ``api_key_env``,
    ``headers``) a :class:`RoutedClient` sending those models' requests to clients opened on ``stack`` for them
    (each endpoint's unset parts taken from ``base``, the run's)."""
    routes: dict[str, ModelClient] = {}
    for model, endpoint in endpoints.items():
        given = endpoint.over(base) if base is not None else endpoint
        routes[model] = await stack.enter_async_context(resolve_model(model, endpoint=given, **options))
    return RoutedClient(client, routes) if routes else client


__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_TOKENS",
    "Admission",
    "Budget",
    "BudgetExceeded",
    "CallClass",
    "CallRefused",
    "Chunk",
    "Completion",
    "CompletionRequest",
    "Delta",
    "Dialect",
    "Endpoint",
    "EndpointError",
    "EndpointLimits",
    "EndpointStats",
    "LocalModelUnavailable",
    "MalformedOutput",
    "Message",
    "ModelClient",
    "ModelError",
    "ModelTimeout",
    "ModelUnavailable",
    "Price",
    "PriceTable",
    "ProviderError",
    "RateLimited",
    "Reservation",
    "Role",
    "RoutedClient",
    "StreamMeter",
    "StructuredMode",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "UsageSource",
    "acquire_call",
    "approx_prompt_tokens",
    "approx_tokens",
    "call_context",
    "check_schema",
    "client_class",
    "dialect_of",
    "load_model_limits",
    "open_routes",
    "parse_headers",
    "resolve_model",
    "split_model",
    "worst_case",
]
