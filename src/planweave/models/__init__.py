"""Model clients: the small :class:`ModelClient` interface, its request and result types, and :func:`resolve_model`.

A client turns a :class:`CompletionRequest` (chat messages, limits, an optional JSON schema) into a
:class:`Completion` (text, parsed JSON, token usage and cost), either at once (:meth:`ModelClient.complete`) or as a
stream of :class:`Delta` items ending with the :class:`Completion` (:meth:`ModelClient.stream`). Implementations:
:class:`planweave.models.openai.OpenAIChatClient` for any OpenAI-compatible Chat Completions endpoint, which also
serves the local model (:mod:`planweave.models.local`) and the scripted test server
(:mod:`planweave.testing.scripted_llm`).

This module holds only data types and the protocol; it imports no HTTP library until :func:`resolve_model` runs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from planweave.models.budget import Budget, Reservation
from planweave.models.errors import (
    BudgetExceeded,
    LocalModelUnavailable,
    MalformedOutput,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
    RateLimited,
)
from planweave.models.pricing import Price, PriceTable, worst_case

Role = Literal["system", "user", "assistant"]
UsageSource = Literal["server", "estimated"]
StructuredMode = Literal["json_schema", "json_object", "prompt"]
"""How structured output was asked for: ``response_format`` json_schema, json_object with a schema, or only the
prompt (the reply is then checked client-side)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What to ask a model: messages, limits and, with ``schema``, a JSON schema the reply must match.

    ``model`` None means the client's default model. ``max_tokens`` None means the server's default (a budget cannot
    bound such a call, so the ``llm`` tool always sets it).
    """

    messages: tuple[Message, ...]
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    schema: Mapping[str, Any] | None = field(default=None, hash=False)
    schema_name: str = "result"
    stop: tuple[str, ...] = ()

    @classmethod
    def of(cls, prompt: str, *, system: str | None = None, **options: Any) -> CompletionRequest:
        """A request of one user message, after an optional system message."""
        messages = (Message("system", system),) if system else ()
        return cls(messages=(*messages, Message("user", prompt)), **options)


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of streamed reply text."""

    text: str


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished model call: the reply, its parsed JSON (when a schema was asked for), usage and cost.

    ``usage_source`` says whether the token counts came from the server or were estimated (four characters per
    token) because it sent none. ``cost_usd`` is None when the price table has no price for ``model``.
    """

    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    usage_source: UsageSource
    cost_usd: float | None
    finish_reason: str | None = None
    parsed: Any = None
    structured_mode: StructuredMode | None = None
    first_token_s: float | None = None
    duration_s: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


Chunk = Delta | Completion
"""An item of :meth:`ModelClient.stream`: text deltas, then exactly one :class:`Completion` last."""


@runtime_checkable
class ModelClient(Protocol):
    """What the planner and the ``llm`` tool need from a model: a default model name, a call, a streamed call.

    Errors are :class:`ModelError` subclasses (never a transport library's exceptions); :class:`MalformedOutput`
    when a schema was given and the reply does not match it; ValueError, before anything is sent, when the schema
    itself is not a valid JSON schema.
    """

    @property
    def model(self) -> str:
        """The model used when a request names none."""
        ...

    async def complete(self, request: CompletionRequest) -> Completion:
        """Run the request and return the whole completion."""
        ...

    def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        """Run the request, yielding :class:`Delta` items as text arrives and then one :class:`Completion`.

        Close the generator when leaving early (``contextlib.aclosing``) so the connection and the model's
        concurrency slot are released at once.
        """
        ...


def check_schema(schema: Mapping[str, Any]) -> None:
    """Raise ValueError if ``schema`` is not a valid JSON schema (checked before a call is sent)."""
    import jsonschema  # ~80 ms to import: only when a schema is checked

    try:
        plain = dict(schema)
        jsonschema.validators.validator_for(plain).check_schema(plain)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"not a valid JSON schema at {path}: {exc.message}") from None


@asynccontextmanager
async def resolve_model(name: str, **options: Any) -> AsyncIterator[ModelClient]:
    """Open a client for a ``--model`` name: ``local`` starts the bundled local model server, anything else is an
    OpenAI-compatible model at ``OPENAI_BASE_URL`` (keyword ``options`` go to the client). Closes it all on exit."""
    from planweave.models.openai import OpenAIChatClient

    if name == "local":
        from planweave.models.local import local_client

        async with local_client(**options) as client:
            yield client
        return
    async with OpenAIChatClient(name, **options) as client:
        yield client


__all__ = [
    "Budget",
    "BudgetExceeded",
    "Chunk",
    "Completion",
    "CompletionRequest",
    "Delta",
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
    "StructuredMode",
    "UsageSource",
    "check_schema",
    "resolve_model",
    "worst_case",
]
