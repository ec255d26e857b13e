"""A :class:`~planweave.models.ModelClient` for any OpenAI-compatible Chat Completions endpoint, over httpx.

``POST {base_url}/chat/completions``, streamed as server-sent events (``data: {...}`` lines ending with
``data: [DONE]``) or not. What this client adds to a bare HTTP call:

* **Retries** on HTTP 429, 5xx, 408/409, timeouts and connection errors, with exponential backoff and jitter; a 429's
  ``Retry-After`` (seconds or an HTTP date) is honoured as given. A stream is retried only until its first text
  arrives: after that a failure is raised, since the text already handed out cannot be taken back.
* **Structured output** with fallbacks: ``response_format`` ``json_schema`` first; when a server rejects it (an HTTP
  400/422/500 whose body mentions response_format or json_schema) the same call is sent again with
  ``{"type": "json_object", "schema": ...}``, then with the schema in the prompt only. The reply is parsed and checked
  against the schema client-side in every mode. What a server accepts is remembered per base URL, as are
  ``stream_options`` (for usage in streams) and ``max_tokens`` versus ``max_completion_tokens``.
* **Admission control**: every attempt of a call waits for a slot from its endpoint's scheduler
  (:mod:`planweave.models.admission`: concurrency, requests and tokens per minute, optionally an adaptive window,
  priority by run and critical-path slack), held for the attempt (the whole stream), not while backing off; it is
  told how the attempt ended (status, time to first token, tokens). Clients given the same
  :class:`~planweave.models.admission.Admission` share the schedulers.
* **Timeouts**: connect, read (the whole reply when not streaming; the first chunk when streaming) and stall (the
  longest gap between two chunks of a stream).
* **Usage and cost**: token counts from the server (``stream_options.include_usage`` for streams) or, if it sends
  none, estimated (a stream's text events, else four characters per token); cost from a
  :class:`~planweave.models.pricing.PriceTable`. Every streamed :class:`Delta` carries the call's usage so far
  (the server's counts where its chunks carry them, else the estimate), so a stream that is cut or cancelled can
  be charged for what it cost.
* **Errors translated at the boundary** into :mod:`planweave.models.errors`, naming the model and base URL, never
  the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import jsonschema
import orjson

from planweave.models.admission import Admission, CallClass, CallTooLarge, EndpointLimits, Grant, call_class
from planweave.models.base import (
    Chunk,
    Completion,
    CompletionRequest,
    Delta,
    Message,
    StructuredMode,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageSource,
    check_schema,
)
from planweave.models.dialects import Dialect, client_class, dialect_of, wire_name
from planweave.models.errors import (
    CallRefused,
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
    PriceTable,
    approx_prompt_tokens,
    approx_tokens,
)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
BODY_EXCERPT = 300  # characters of an error body kept in ProviderError


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds to wait: for a connection, for a reply (the first chunk of a stream), between two chunks of a stream."""

    connect: float = 10.0
    read: float = 120.0
    stall: float = 30.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """How often and how long to retry a transient failure: ``attempts`` calls in all, waits doubling from ``base``
    up to ``cap`` (with jitter). A ``Retry-After`` longer than ``max_retry_after`` is not waited for: the
    :class:`RateLimited` error is raised at once so the caller's own retry policy can decide."""

    attempts: int = 4
    base: float = 0.5
    cap: float = 20.0
    max_retry_after: float = 60.0


NO_RETRIES = Backoff(attempts=1)


@dataclass(slots=True)
class ServerCompat:
    """What an endpoint accepts, learned from its errors and remembered per base URL for every later call."""

    structured: StructuredMode = "json_schema"
    stream_options: bool = True
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"


_COMPAT: dict[str, ServerCompat] = {}
_FALLBACK: Mapping[StructuredMode, StructuredMode] = {"json_schema": "json_object", "json_object": "prompt"}
_ADAPTABLE_STATUS = frozenset({400, 422, 500})


def server_compat(base_url: str) -> ServerCompat:
    """What this process has learned about the endpoint at ``base_url`` (shared by all clients of that URL)."""
    return _COMPAT.setdefault(base_url.rstrip("/"), ServerCompat())


def reset_server_compat() -> None:
    """Forget what was learned about every endpoint (tests whose servers may reuse a port start afresh)."""
    _COMPAT.clear()


class _Adapted(Exception):
    """Internal: the endpoint rejected a feature, the compat record was downgraded; send the call again."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP date (None if absent or bad)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _schema_instruction(schema: Mapping[str, Any]) -> str:
    return (
        "\n\nReply with only a JSON value (no prose, no code fence) that matches this JSON schema:\n"
        + orjson.dumps(schema).decode()
    )


def _json_value(text: str) -> Any:
    """Parse a JSON reply, tolerating what models asked in the prompt add: a code fence, or prose around it."""
    t = text.strip()
    if t.startswith("```"):
        first_newline = t.find("\n")
        if first_newline != -1 and t.endswith("```"):
            t = t[first_newline + 1 : -3].strip()
    try:
        return orjson.loads(t)
    except orjson.JSONDecodeError:
        starts = [i for i in (t.find("{"), t.find("[")) if i != -1]
        end = max(t.rfind("}"), t.rfind("]"))
        if not starts or end <= min(starts) or (min(starts) == 0 and end == len(t) - 1):
            raise
        return orjson.loads(t[min(starts) : end + 1])


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole (not streamed) reply, read from a dialect's response body: usage in Chat Completions' shape
    (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
    ``completion_tokens_details.reasoning_tokens``, ``cache_write_tokens``) whatever the dialect."""

    text: str
    model: str | None
    usage: Mapping[str, Any] | None
    finish_reason: str | None
    logprobs: tuple[tuple[float, ...], ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""


class OpenAIChatClient:
    """A client for one OpenAI-compatible endpoint; ``model`` is the default model of requests that name none.

    Use it as ``async with OpenAIChatClient("gpt-4o-mini") as client`` (or call :meth:`aclose`). ``base_url`` and
    ``api_key`` default to ``OPENAI_BASE_URL`` (else https://api.openai.com/v1) and ``OPENAI_API_KEY``.
    ``concurrency`` limits calls in flight per model: an int for every model, or a mapping of model name to limit
    (key ``"*"`` for the others); None for no limit: a fixed limit, first come first served. ``admission`` replaces
    it with shared schedulers and their limits (:class:`~planweave.models.admission.Admission`). ``fold_system``
    merges system messages into the first user message, for chat templates without a system role (Gemma). An
    ``http`` client passed in keeps its own timeouts and is not closed by this one. ``headers`` go with every request
    (their values, like the key, are hidden from error messages); a run's or a tier's endpoint gives them
    (:class:`~planweave.models.endpoint.Endpoint`).

    The transport (retries, admission, timeouts, stream accounting) is this class's; the wire format is in a few
    methods a dialect's client overrides (:mod:`planweave.models.openai_responses`,
    :mod:`planweave.models.anthropic`): ``_payload``, ``_reply``, ``_event_text``, ``_auth_headers``, ``_adapt``.
    """

    dialect: Dialect = "chat"
    path = "/chat/completions"
    default_base_url = DEFAULT_BASE_URL
    base_url_env = "OPENAI_BASE_URL"
    key_env = "OPENAI_API_KEY"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeouts: Timeouts = Timeouts(),
        backoff: Backoff = Backoff(),
        concurrency: int | Mapping[str, int] | None = 16,
        prices: PriceTable | None = None,
        fold_system: bool = False,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        admission: Admission | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._model = model
        self._given = (base_url, api_key, dict(headers or {}))  # what a sibling of another dialect is opened with
        self._siblings: dict[Dialect, OpenAIChatClient] = {}
        self.base_url = (base_url or self._env_base_url() or self.default_base_url).rstrip("/")
        key = api_key if api_key is not None else os.environ.get(self.key_env)
        self._headers = {**(headers or {}), **self._auth_headers(key)}
        self._key = key or ""
        self._secrets = tuple(v for v in (key, *(headers or {}).values()) if v)
        self.timeouts = timeouts
        self.backoff = backoff
        self.prices = prices or PriceTable()
        self.fold_system = fold_system
        self.admission = admission if admission is not None else _fixed_admission(concurrency)
        self._own_http = http is None
        self._http = http
        self._rng = rng or random.Random()
        self._url = f"{self.base_url}{self.path}"

    @classmethod
    def _env_base_url(cls) -> str | None:
        return os.environ.get(cls.base_url_env)

    def _auth_headers(self, key: str | None) -> dict[str, str]:
        """The headers carrying the key (the endpoint's own scheme)."""
        return {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def model(self) -> str:
        return self._model

    @property
    def compat(self) -> ServerCompat:
        """What is known about this client's endpoint (see :class:`ServerCompat`)."""
        return server_compat(self.base_url)

    async def __aenter__(self) -> OpenAIChatClient:
        self._client()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _sibling(self, request: CompletionRequest) -> OpenAIChatClient | None:
        """The client for a request naming a model of another dialect by its prefix (a tier table or a step mixing
        ``openai:`` and ``anthropic:`` models behind one run's client): opened once, on this client's base URL, key
        and headers when they were given (else that dialect's defaults), sharing its pool, admission and prices.
        None when the request is this client's dialect (a name without a prefix always is)."""
        name = request.model
        if name is None or wire_name(name) == name or dialect_of(name) == self.dialect:
            return None
        dialect = dialect_of(name)
        if dialect not in self._siblings:
            base_url, api_key, headers = self._given
            self._siblings[dialect] = client_class(name)(
                name, base_url=base_url, api_key=api_key, headers=headers, timeouts=self.timeouts,
                backoff=self.backoff, prices=self.prices, fold_system=self.fold_system, http=self._client(),
                rng=self._rng, admission=self.admission)
        return self._siblings[dialect]

    async def aclose(self) -> None:
        """Close the connection pool (only if this client created it)."""
        for sibling in self._siblings.values():
            await sibling.aclose()  # they share this client's pool: nothing of theirs to close but their own
        self._siblings.clear()
        if self._http is not None and self._own_http:
            await self._http.aclose()
            self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            t = self.timeouts
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(t.read, connect=t.connect),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._http

    def concurrency_limit(self, model: str) -> int | None:
        """How many calls to ``model`` this client lets run at once at most (None: no limit)."""
        return self.admission.limits_for(model).max_concurrency

    @asynccontextmanager
    async def _slot(self, model: str, call: CallClass, tokens: int, since: float) -> AsyncIterator[Grant]:
        """Hold an admission slot of ``model``'s endpoint for one attempt; tell the scheduler how it ended."""
        scheduler = self.admission.endpoint(self.base_url, model)
        try:
            async with scheduler.slot(call, tokens, since=since) as grant:
                try:
                    yield grant
                except ModelError as exc:
                    if grant.outcome is None:
                        status, retry_after = _status_of(exc)
                        grant.done(status, retry_after=retry_after)
                    raise
        except CallTooLarge as exc:
            raise CallRefused(str(exc), model=model, base_url=self.base_url) from None

    # -- the request --------------------------------------------------------------------------------------------
    def _payload(
        self, request: CompletionRequest, model: str, *, stream: bool
    ) -> tuple[dict[str, Any], StructuredMode | None, ServerCompat]:
        """The JSON body for ``request``, the structured mode used, and a copy of the compat record it was built on."""
        compat = dataclasses.replace(self.compat)
        messages = list(request.messages)
        if self.fold_system:
            messages = _fold_system(messages)
        mode: StructuredMode | None = None
        body: dict[str, Any] = {"model": wire_name(model)}
        if request.tools:
            body["tools"] = [{"type": "function", "function": _function(t)} for t in request.tools]
            body["tool_choice"] = (request.tool_choice if request.tool_choice in ("auto", "required", "none")
                                   else {"type": "function", "function": {"name": request.tool_choice}})
        if request.schema is not None:
            mode = compat.structured
            schema = dict(request.schema)
            if mode == "json_schema":
                body["response_format"] = {
                    "type": "json_schema", "json_schema": {"name": request.schema_name, "schema": schema},
                }
            else:
                if mode == "json_object":
                    body["response_format"] = {"type": "json_object", "schema": schema}
                messages = _with_instruction(messages, _schema_instruction(schema))
        body["messages"] = [_chat_message(m) for m in messages]
        if request.max_tokens is not None:
            body[compat.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop"] = list(request.stop)
        if request.logprobs is not None:  # only when asked: not every endpoint takes it
            body["logprobs"] = True
            body["top_logprobs"] = request.logprobs
        if stream:
            body["stream"] = True
            if compat.stream_options:
                body["stream_options"] = {"include_usage": True}
        return body, mode, compat

    def _adapt(self, status: int, body: str, request: CompletionRequest, sent: ServerCompat, *, stream: bool) -> bool:
        """Downgrade what we ask of the endpoint after it rejected a feature of a call sent with ``sent``.

        True means: send the call again (with the current record, which a concurrent call may already have changed).
        """
        if status not in _ADAPTABLE_STATUS:
            return False
        text = body.lower()
        compat = self.compat
        if request.schema is not None and sent.structured in _FALLBACK and (
            "response_format" in text or "json_schema" in text or "json schema" in text
        ):
            if compat.structured == sent.structured:  # else another call has stepped down already
                compat.structured = _FALLBACK[sent.structured]
            return True
        if stream and sent.stream_options and "stream_options" in text:
            compat.stream_options = False
            return True
        if sent.max_tokens_field == "max_tokens" and "max_completion_tokens" in text:
            compat.max_tokens_field = "max_completion_tokens"
            return True
        return False

    def _translate(self, exc: httpx.HTTPError, model: str) -> ModelError:
        where = {"model": model, "base_url": self.base_url}
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.ConnectTimeout):
            return ModelTimeout(f"no connection within {self.timeouts.connect:g}s", **where)
        if isinstance(exc, httpx.PoolTimeout):
            return ModelTimeout(f"no free connection in the pool: {detail}", **where)
        if isinstance(exc, httpx.TimeoutException):
            return ModelTimeout(f"no reply within {self.timeouts.read:g}s", **where)
        if isinstance(exc, httpx.ConnectError):
            return ModelUnavailable(f"cannot connect ({detail})", **where)
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return ModelUnavailable(f"connection dropped ({detail})", **where)
        return ModelUnavailable(f"{type(exc).__name__}: {detail}", **where)

    def _status_error(self, response: httpx.Response, body: str, model: str) -> ModelError:
        where = {"model": model, "base_url": self.base_url}
        status = response.status_code
        if status == 429:
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            ms = response.headers.get("retry-after-ms")
            if ms is not None:
                try:
                    retry_after = max(0.0, float(ms) / 1000)
                except ValueError:
                    pass
            wait = f", retry after {retry_after:g}s" if retry_after is not None else ""
            return RateLimited(f"rate limited (HTTP 429{wait}): {_excerpt(body)}", retry_after=retry_after, **where)
        return ProviderError(f"HTTP {status}: {_excerpt(body)}", status=status, body=_excerpt(body), **where)

    async def _open(
        self, request: CompletionRequest, model: str, *, stream: bool
    ) -> tuple[httpx.Response, StructuredMode | None]:
        """Send the call; return a 2xx response (open if streaming) or raise ModelError or _Adapted."""
        payload, mode, sent = self._payload(request, model, stream=stream)
        http = self._client()
        req = http.build_request("POST", self._url, content=orjson.dumps(payload),
                                 headers={**self._headers, "Content-Type": "application/json"})
        try:
            response = await http.send(req, stream=stream)
        except httpx.HTTPError as exc:
            raise self._translate(exc, model) from exc
        if response.status_code < 400:
            return response, mode
        try:
            body = (await response.aread()).decode("utf-8", "replace")
        except httpx.HTTPError:
            body = ""
        finally:
            await response.aclose()
        for secret in self._secrets:
            body = body.replace(secret, "***")  # some servers echo the key (or a header) they refused
        if self._adapt(response.status_code, body, request, sent, stream=stream):
            raise _Adapted
        raise self._status_error(response, body, model)

    async def _pause(self, exc: ModelError, attempt: int) -> None:
        """Wait before retry ``attempt`` (1-based) after ``exc``; re-raise it if it is final or asks too long a wait."""
        b = self.backoff
        transient = isinstance(exc, (RateLimited, ModelTimeout, ModelUnavailable)) or (
            isinstance(exc, ProviderError) and exc.retryable
        )
        if not transient or attempt >= b.attempts:
            raise exc
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            if exc.retry_after > b.max_retry_after:
                raise exc
            delay = exc.retry_after
        else:
            delay = min(b.cap, b.base * 2 ** (attempt - 1)) * (0.5 + self._rng.random() / 2)
        await asyncio.sleep(delay)

    # -- the result ----------------------------------------------------------------------------------------------
    def _finish(
        self,
        request: CompletionRequest,
        *,
        model: str,
        text: str,
        usage: Mapping[str, Any] | None,
        finish_reason: str | None,
        mode: StructuredMode | None,
        started: float,
        first_token: float | None,
        text_events: int = 0,
        logprobs: tuple[tuple[float, ...], ...] | None = None,
        tool_calls: tuple[ToolCall, ...] = (),
        reasoning: str = "",
    ) -> Completion:
        """The Completion of a finished call; without server usage, a stream's text events count as its tokens
        (servers send about one token per event), else four characters make a token."""
        source: UsageSource
        prompt = usage.get("prompt_tokens") if usage else None
        completion = usage.get("completion_tokens") if usage else None
        if isinstance(prompt, int) and isinstance(completion, int):
            source = "server"
        else:
            source = "estimated"
            prompt = approx_prompt_tokens(m.content for m in request.messages)
            completion = text_events or approx_tokens(text)
        parsed = self._parse(request, text, model, finish_reason) if request.schema is not None else None
        now = asyncio.get_running_loop().time()
        cached, written = _cached_tokens(usage), _count(usage, "cache_write_tokens") or 0
        priced = model if wire_name(self._model) != model else self._model  # the dialect prefix helps the prices
        return Completion(
            text=text,
            model=model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            usage_source=source,
            cost_usd=self.prices.cost(priced, prompt, completion, cached, cache_write_tokens=written),
            tool_calls=tool_calls,
            cached_tokens=cached,
            cache_write_tokens=written,
            reasoning_tokens=_reasoning_tokens(usage),
            reasoning=reasoning,
            finish_reason=finish_reason,
            parsed=parsed,
            structured_mode=mode,
            first_token_s=None if first_token is None else first_token - started,
            duration_s=now - started,
            logprobs=logprobs if request.logprobs is not None else None,
        )

    def _parse(self, request: CompletionRequest, text: str, model: str, finish_reason: str | None) -> Any:
        assert request.schema is not None
        where = {"model": model, "base_url": self.base_url}
        hint = (" (the reply was cut at max_tokens: raise max_tokens, or bound the schema with maxItems/maxLength)"
                if finish_reason == "length" else "")
        try:
            value = _json_value(text)
        except orjson.JSONDecodeError as exc:
            raise MalformedOutput(
                f"reply is not valid JSON ({exc}){hint}: {_excerpt(text, 200)}", text=text, **where
            ) from None
        schema = dict(request.schema)
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise MalformedOutput(
                f"reply does not match the schema at {path}: {error.message}{hint}", text=text, **where
            )
        return value

    def _event_text(self, line: bytes, state: _StreamState) -> str:
        """Fold one line of a server-sent event stream into ``state``; return the text it adds."""
        if state.done or not line.startswith(b"data:"):
            return ""  # blank separators, comments (": ping"), event names, anything after [DONE]
        data = line[5:].strip()
        if data == b"[DONE]":
            state.done = True
            return ""
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise self._bad_reply(state.requested, "stream event is not JSON", body=_text(data)) from None
        if not isinstance(event, dict):
            raise self._bad_reply(state.requested, "stream event is not an object", body=_text(data))
        if "error" in event:
            raise self._bad_reply(state.requested, "error in stream", body=_text(data))
        state.model = event.get("model") or state.model
        text = ""
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                state.tool_piece(int(call.get("index") or 0), call.get("id"), function.get("name"),
                                 function.get("arguments") or "")
            if delta.get("reasoning_content"):  # vLLM's and DeepSeek's reasoning parsers
                state.reasoning.append(str(delta["reasoning_content"]))
            content = delta.get("content")
            if content:
                text += content
                state.text_events += 1
            state.finish = choice.get("finish_reason") or state.finish
            if state.logprobs is not None:
                state.logprobs.extend(_token_logprobs(choice.get("logprobs")))
        if text:
            state.pieces.append(text)
            state.chars += len(text)
        if event.get("usage"):  # the last chunk's (include_usage) or, with continuous usage, every chunk's
            state.usage = event["usage"]
            state.events_at_usage = state.text_events
        return text

    reply_kind = "chat completion"

    def _new_state(self, request: CompletionRequest, model: str) -> _StreamState:
        """A stream's state before its first event."""
        state = _StreamState(model, prompt_estimate=approx_prompt_tokens(m.content for m in request.messages))
        if request.logprobs is not None:
            state.logprobs = []
        return state

    def _reply(self, data: Any, request: CompletionRequest) -> Reply:
        """A whole reply's parts from its JSON body (KeyError, TypeError, ...: not a reply of this dialect)."""
        choice = data["choices"][0]
        message = choice["message"]
        calls = tuple(ToolCall(str(c.get("id") or ""), str(c["function"]["name"]),
                               str(c["function"].get("arguments") or ""))
                      for c in message.get("tool_calls") or ())
        return Reply(message.get("content") or "", data.get("model"), data.get("usage"), choice.get("finish_reason"),
                     tuple(_token_logprobs(choice.get("logprobs"))), calls,
                     str(message.get("reasoning_content") or ""))

    def _bad_reply(self, model: str, what: str, status: int = 200, body: str = "") -> ProviderError:
        return ProviderError(f"{what}: {_excerpt(body)}", status=status, body=_excerpt(body), model=model,
                             base_url=self.base_url)

    # -- ModelClient -------------------------------------------------------------------------------------------------
    async def complete(self, request: CompletionRequest) -> Completion:
        """Run the request without streaming and return the completion (retrying transient failures)."""
        sibling = self._sibling(request)
        if sibling is not None:
            return await sibling.complete(request)
        model = request.model or self._model
        if request.schema is not None:
            check_schema(request.schema)
        loop = asyncio.get_running_loop()
        call, tokens = call_class(), _admission_tokens(request)
        started = loop.time()
        attempt = 0
        while True:
            try:
                async with self._slot(model, call, tokens, started) as grant:
                    response, mode = await self._open(request, model, stream=False)
                    try:
                        reply = self._reply(orjson.loads(response.content), request)
                    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError):
                        raise self._bad_reply(model, f"reply is not a {self.reply_kind}", response.status_code,
                                              response.text) from None
                    grant.done(response.status_code, tokens=_server_tokens(reply.usage))
                    return self._finish(request, model=reply.model or model, text=reply.text,
                                        usage=reply.usage, finish_reason=reply.finish_reason,
                                        mode=mode, started=started, first_token=None,
                                        logprobs=reply.logprobs, tool_calls=reply.tool_calls,
                                        reasoning=reply.reasoning)
            except _Adapted:
                continue
            except ModelError as exc:
                if isinstance(exc, MalformedOutput):
                    raise
                attempt += 1
                await self._pause(exc, attempt)

    def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        """Run the request streaming: yield :class:`Delta` items as text arrives, then the :class:`Completion`.

        Failures before the first text are retried like :meth:`complete`; after it they are raised. A gap of more
        than ``timeouts.stall`` seconds between chunks (``timeouts.read`` before the first) raises ModelTimeout.
        """
        return (self._sibling(request) or self)._stream(request)

    async def _stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        model = request.model or self._model
        if request.schema is not None:
            check_schema(request.schema)
        loop = asyncio.get_running_loop()
        call, tokens = call_class(), _admission_tokens(request)
        started = loop.time()
        attempt = 0
        while True:
            yielded = False
            try:
                async with self._slot(model, call, tokens, started) as grant:
                    sent = loop.time()
                    response, mode = await self._open(request, model, stream=True)
                    chunks = response.aiter_bytes()
                    state = self._new_state(request, model)
                    first_token: float | None = None
                    buffer = b""
                    ended = False
                    try:
                        limit = self.timeouts.read
                        while not state.done:
                            try:
                                async with asyncio.timeout(limit):
                                    data = await anext(chunks, None)
                            except TimeoutError:
                                got = f" after {state.chars} characters" if state.chars else ""
                                raise ModelTimeout(f"stream stalled: nothing for {limit:g}s{got}", model=model,
                                                   base_url=self.base_url) from None
                            except httpx.HTTPError as exc:
                                raise self._translate(exc, model) from exc
                            if data is None:
                                data, state.done, ended = b"\n", True, True  # a last line without a newline
                            limit = self.timeouts.stall
                            buffer += data
                            if b"\n" not in data:
                                continue
                            *lines, buffer = buffer.split(b"\n")
                            # One Delta per network read, not per event: fewer hand-offs when tokens arrive fast.
                            text = "".join([self._event_text(line, state) for line in lines])
                            pieces = state.deltas(text)
                            if pieces:
                                first_token = loop.time() if first_token is None else first_token
                                yielded = True
                                for piece in pieces:
                                    yield piece
                        if not ended:
                            await _drain(chunks)
                    finally:
                        await _close(chunks)
                        await response.aclose()
                    grant.done(response.status_code, first_token_s=None if first_token is None else first_token - sent,
                               tokens=_server_tokens(state.usage))
                    completion = self._finish(request, model=state.model, text="".join(state.pieces),
                                              usage=state.usage, finish_reason=state.finish, mode=mode,
                                              started=started, first_token=first_token,
                                              text_events=state.text_events,
                                              logprobs=None if state.logprobs is None else tuple(state.logprobs),
                                              tool_calls=state.calls(), reasoning="".join(state.reasoning))
                yield completion  # the slot is free once the reply is whole
                return
            except _Adapted:
                continue
            except ModelError as exc:
                if yielded or isinstance(exc, MalformedOutput):
                    raise
                attempt += 1
                await self._pause(exc, attempt)


@dataclass(slots=True)
class _StreamState:
    """What a stream has said so far."""

    requested: str
    model: str = ""
    pieces: list[str] = field(default_factory=list)
    chars: int = 0
    text_events: int = 0
    usage: Mapping[str, Any] | None = None
    events_at_usage: int = 0  # text events seen when ``usage`` arrived
    finish: str | None = None
    done: bool = False
    prompt_estimate: int = 0
    logprobs: list[tuple[float, ...]] | None = None  # per token, best first (when the request asked for them)
    tools: dict[int, list[str]] = field(default_factory=dict)  # index → [id, name, arguments so far]
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)  # not yet handed out
    reasoning: list[str] = field(default_factory=list)
    forced: str | None = None  # the tool whose input is the reply's text (structured output by tool forcing)
    raw_usage: dict[str, Any] | None = None  # a dialect's own usage, merged over a stream's events

    def __post_init__(self) -> None:
        self.model = self.model or self.requested

    def tool_piece(self, index: int, call_id: str | None, name: str | None, arguments: str) -> None:
        """Fold a piece of tool call ``index`` in (its id and name come with its first piece)."""
        known = self.tools.setdefault(index, ["", "", ""])
        first = not known[1]
        known[0] = known[0] or (call_id or "")
        known[1] = known[1] or (name or "")
        known[2] += arguments
        if first or arguments:
            self.tool_deltas.append(ToolCallDelta(index, known[0] or None if first else None,
                                                  known[1] or None if first else None, arguments))

    def deltas(self, text: str) -> list[Delta]:
        """What to hand out after a read: its text, then the tool call pieces it brought."""
        out = [Delta(text, self.usage_so_far())] if text else []
        out += [Delta("", self.usage_so_far(), tool_call=d) for d in self.tool_deltas]
        self.tool_deltas.clear()
        return out

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(i, n, a) for _, (i, n, a) in sorted(self.tools.items()))

    def usage_so_far(self) -> Usage:
        """The call's usage up to now: the server's last counts plus one token per text event since (servers send
        about one per event), else the prompt estimate and the text events (as :meth:`OpenAIChatClient._finish`)."""
        usage = self.usage
        prompt = usage.get("prompt_tokens") if usage else None
        completion = usage.get("completion_tokens") if usage else None
        if isinstance(prompt, int) and isinstance(completion, int):
            since = self.text_events - self.events_at_usage
            return Usage(prompt, completion + since, "server" if since == 0 else "estimated")
        return Usage(self.prompt_estimate, max(self.text_events, -(-self.chars // CHARS_PER_TOKEN)), "estimated")


def _token_logprobs(block: Any) -> list[tuple[float, ...]]:
    """Per token, its logprob and its alternatives' (best first), from a choice's ``logprobs`` block (OpenAI's
    ``{"content": [{"token", "logprob", "top_logprobs": [...]}]}``); nothing when the endpoint sent none."""
    content = block.get("content") if isinstance(block, dict) else None
    tokens: list[tuple[float, ...]] = []
    for item in content if isinstance(content, list) else ():
        if not isinstance(item, dict):
            continue
        top = [t.get("logprob") for t in item.get("top_logprobs") or () if isinstance(t, dict)]
        values = [v for v in top if isinstance(v, int | float)] or (
            [item["logprob"]] if isinstance(item.get("logprob"), int | float) else [])
        if values:
            tokens.append(tuple(sorted((float(v) for v in values), reverse=True)))
    return tokens


async def _drain(chunks: AsyncIterator[bytes], timeout: float = 1.0) -> None:
    """Read what follows ``data: [DONE]`` (the end of the body), so the connection goes back to the pool.

    A response closed before its end takes its connection with it: the next call would pay for a new one.
    """
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(timeout):
            async for _ in chunks:
                pass


async def _close(iterator: AsyncIterator[bytes]) -> None:
    close = getattr(iterator, "aclose", None)  # httpx's byte iterator is an async generator
    if close is not None:
        await close()


def _fixed_admission(concurrency: int | Mapping[str, int] | None) -> Admission:
    """The admission of a client given only ``concurrency``: a fixed limit per model, first come first served."""
    if concurrency is None or isinstance(concurrency, int):
        return Admission(default=EndpointLimits(max_concurrency=concurrency, order="fcfs"))
    return Admission({name: EndpointLimits(max_concurrency=limit, order="fcfs") for name, limit in concurrency.items()},
                     default=EndpointLimits(max_concurrency=None, order="fcfs"))


def _admission_tokens(request: CompletionRequest) -> int:
    """The tokens a call is admitted with (what providers count against tokens per minute: prompt plus max_tokens)."""
    out = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
    return approx_prompt_tokens(m.content for m in request.messages) + out


def _cached_tokens(usage: Mapping[str, Any] | None) -> int:
    """The prompt tokens the provider read from its cache (``prompt_tokens_details.cached_tokens``: billed at the
    model's cached input rate), else 0."""
    details = usage.get("prompt_tokens_details") if usage else None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else 0


def _count(usage: Mapping[str, Any] | None, name: str, within: str | None = None) -> int | None:
    """An integer count of ``usage`` (in its ``within`` block), else None."""
    block: Any = usage.get(within) if usage and within else usage
    value = block.get(name) if isinstance(block, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reasoning_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """The output tokens spent reasoning (``completion_tokens_details.reasoning_tokens``), None if not said."""
    return _count(usage, "reasoning_tokens", "completion_tokens_details")


def _function(tool: ToolSpec) -> dict[str, Any]:
    """A tool as OpenAI's function definition (name, description, parameters)."""
    spec: dict[str, Any] = {"name": tool.name, "parameters": dict(tool.parameters)}
    if tool.description:
        spec["description"] = tool.description
    return spec


def _server_tokens(usage: Mapping[str, Any] | None) -> int | None:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None


def _status_of(exc: ModelError) -> tuple[int | None, float | None]:
    """The HTTP status an attempt's error stands for, for the admission window, and a 429's Retry-After."""
    if isinstance(exc, RateLimited):
        return 429, exc.retry_after
    if isinstance(exc, ProviderError):
        return exc.status, None
    if isinstance(exc, ModelTimeout):
        return 504, None  # no answer in time: the endpoint is overloaded as surely as with a 5xx
    if isinstance(exc, MalformedOutput):
        return 200, None
    return None, None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _excerpt(text: str, limit: int = BODY_EXCERPT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _chat_message(m: Message) -> dict[str, Any]:
    """A message as Chat Completions writes it: an assistant's tool calls, a tool result by its call id."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.tool_calls:
        return {"role": m.role, "content": m.content or None, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls]}
    return {"role": m.role, "content": m.content}


def _fold_system(messages: list[Message]) -> list[Message]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    if not system:
        return rest
    for i, m in enumerate(rest):
        if m.role == "user":
            rest[i] = Message("user", f"{system}\n\n{m.content}")
            return rest
    return [Message("user", system), *rest]


def _with_instruction(messages: list[Message], instruction: str) -> list[Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            out = list(messages)
            out[i] = Message("user", messages[i].content + instruction)
            return out
    return [*messages, Message("user", instruction.strip())]
