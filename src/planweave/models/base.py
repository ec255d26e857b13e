"""The model interface's data types and protocol: requests, completions, stream chunks and :class:`ModelClient`.

A leaf of the models package: it imports no other models module, so the clients (``openai``, ``local``) build on it
and the package's ``__init__`` re-exports it without an import cycle. Import these names from
:mod:`planweave.models`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]
UsageSource = Literal["server", "estimated"]
StructuredMode = Literal["json_schema", "json_object", "prompt", "tool"]
"""How structured output was asked for: ``response_format`` json_schema (Chat Completions; ``text.format`` in the
Responses API), json_object with a schema, only the prompt, or a forced tool whose input is the reply (Anthropic
Messages). The reply is checked against the schema client-side in every mode."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. An assistant message may carry the ``tool_calls`` the model made; a ``tool`` message is
    the result of the call ``tool_call_id`` (each dialect writes these in its own shape)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: its name, what it does and a JSON schema of its arguments (an object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}, hash=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of a :class:`ToolSpec` the model made: the provider's call id, the function and its arguments as the
    JSON text the model wrote (:meth:`parsed_arguments` parses it)."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments as JSON; ValueError naming the tool when the model wrote something else."""
        import json

        try:
            return json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call '{self.name}' ({self.id}): arguments are not JSON ({exc})") from None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: ``index`` tells the calls of one reply apart; ``id`` and ``name`` come with
    the call's first piece (None after), ``arguments`` is the next piece of its JSON arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


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
    logprobs: int | None = None  # ask for each token's top N logprobs (where the endpoint gives them)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    """With ``tools``: ``"auto"`` (the model decides), ``"required"`` (some tool), ``"none"``, or a tool's name."""

    @classmethod
    def of(cls, prompt: str, *, system: str | None = None, **options: Any) -> CompletionRequest:
        """A request of one user message, after an optional system message."""
        messages = (Message("system", system),) if system else ()
        return cls(messages=(*messages, Message("user", prompt)), **options)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call has used so far: from the server's own counts (``source`` "server") or estimated."""

    prompt_tokens: int
    completion_tokens: int
    source: UsageSource

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of streamed reply text; ``usage``, when the client knows it, is the call's usage up to this piece
    (so a stream that is cut or cancelled can still be charged for what it cost)."""

    text: str
    usage: Usage | None = None
    tool_call: ToolCallDelta | None = None  # with ``text`` "": a piece of a tool call (requests with ``tools``)


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished model call: the reply, its parsed JSON (when a schema was asked for), usage and cost.

    ``usage_source`` says whether the token counts came from the server or were estimated (four characters per
    token) because it sent none. ``cost_usd`` is None when the price table has no price for ``model`` (or for a kind
    of token the call used, such as cache writes). ``prompt_tokens`` counts every input token, those read from the
    provider's cache (``cached_tokens``) and written to it (``cache_write_tokens``) included; ``completion_tokens``
    counts every output token, reasoning included (``reasoning_tokens``: None when the provider does not say).
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
    logprobs: tuple[tuple[float, ...], ...] | None = field(default=None, compare=False)  # per token, best first
    tool_calls: tuple[ToolCall, ...] = ()
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int | None = None
    reasoning: str = ""  # the reasoning summary or thinking text the provider showed, if any

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
