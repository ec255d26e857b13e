"""A scripted OpenAI-compatible server on 127.0.0.1, for tests and benchmarks of model clients (not a model).

It serves ``POST /v1/chat/completions`` (streamed as server-sent events like the real API, or not) and
``GET /v1/models`` over real HTTP/1.1 (asyncio streams and h11, the HTTP state machine httpx itself uses). Each chat
request takes the next reply of its *script*: a sequence of replies, or a function from the request to a reply.
Replies are :class:`Text` (any text: prose, JSON, JSON-lines plans, malformed output), :class:`HttpError` (429 with
``Retry-After``, 500, ...), :class:`Stall` (stop sending mid-stream) and :class:`Drop` (cut the connection). Time to
first token and tokens per second are configurable. Every request is recorded in :attr:`ScriptedLLM.requests`.

A :class:`Congestion` model (off by default) makes it behave like an overloaded endpoint: past a concurrency knee
each call is slower (time to first token up, tokens per second down, so throughput falls), past a hard limit calls
get HTTP 429 at once. Every chat call's start, end, status, concurrency and tokens are kept in
:attr:`ScriptedLLM.served`, for tests that check what a client really sent. A streamed call is billed as it goes,
like a real provider: its prompt when the stream starts, each token as it is written, so a stream that is cut
(:class:`Drop`, a client that goes away) is billed for what was sent. With ``stream_options.include_usage`` the
usage comes in a last chunk; with ``usage_in_every_chunk`` (or the request's ``continuous_usage_stats``, vLLM's
option) every content chunk carries the usage so far. With ``honour_max_tokens`` a reply longer than the request's
``max_tokens`` (or ``max_completion_tokens``) is cut there, ``finish_reason`` "length", as a real model's is.

    server = ScriptedLLM([Text("hello"), HttpError(429, retry_after=1), Text("again")])
    async with server as base_url:          # http://127.0.0.1:PORT/v1
        ...
    server.requests[0].body["messages"]

Manual runs: ``python -m planweave.testing.scripted_llm --port 8000 --script replies.jsonl`` where each line is a
reply as :func:`reply_from_json` reads it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import itertools
import json
import math
import re
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import h11
import orjson
import typer

from planweave.testing.scripted_dialects import (
    PATHS,
    AnthropicEncoder,
    Call,
    Dialect,
    ResponsesEncoder,
    StreamEncoder,
    Tokens,
    anthropic_body,
    error_body,
    forced_tool,
    messages_of,
    responses_body,
)

_TOKEN = re.compile(r"\s*\S{1,4}|\s+")


def split_tokens(text: str) -> list[str]:
    """Split text into the pieces the server streams and counts as completion tokens (about four characters)."""
    return _TOKEN.findall(text)


def plan_lines(steps: Iterable[Mapping[str, Any]]) -> str:
    """A JSON-lines plan: one JSON object per line (what a planner model is asked to write)."""
    return "".join(orjson.dumps(dict(s)).decode() + "\n" for s in steps)


@dataclass(frozen=True, slots=True)
class Text:
    """Answer with ``text``. Unset timings take the server's defaults; ``usage=False`` sends no token counts;
    ``prompt_tokens``/``completion_tokens`` replace the counted ones. ``logprobs``, sent only to a request that asks
    for logprobs, are each token's top logprobs (best first; the last entry serves every token past the list).
    ``tool_calls`` follow the text (their arguments streamed in pieces; ``finish_reason`` "stop" becomes
    "tool_calls"); ``reasoning`` comes before it (Chat ``reasoning_content``, a Responses ``reasoning`` item's
    summary, an Anthropic ``thinking`` block), counted as output and reasoning tokens; ``cached_tokens`` and
    ``cache_write_tokens`` of the prompt are reported as read from and written to the provider's cache."""

    text: str
    ttft: float | None = None
    tokens_per_second: float | None = None
    finish_reason: str = "stop"
    usage: bool = True
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: tuple[tuple[float, ...], ...] | None = None
    tool_calls: tuple[Call, ...] = ()
    reasoning: str = ""
    cached_tokens: int = 0
    cache_write_tokens: int = 0


def _logprobs_block(reply: Text, pieces: Sequence[str], first: int) -> dict[str, Any]:
    """The OpenAI ``logprobs`` block of ``pieces``, tokens ``first``.. of ``reply``."""
    table = reply.logprobs or ((0.0,),)
    content = []
    for i, piece in enumerate(pieces, start=first):
        top = table[min(i, len(table) - 1)]
        content.append({"token": piece, "logprob": top[0],
                        "top_logprobs": [{"token": piece if j == 0 else f"<alt{j}>", "logprob": lp}
                                         for j, lp in enumerate(top)]})
    return {"content": content}


def _asks_logprobs(req: RecordedRequest, reply: Text) -> bool:
    return isinstance(req.body, dict) and bool(req.body.get("logprobs")) and reply.logprobs is not None


def _add_logprobs(chunk: dict[str, Any], reply: Text | None, delta: Mapping[str, Any], index: int) -> None:
    """Give a content chunk its token's logprobs (``reply`` None: the request asked for none)."""
    if reply is not None and delta.get("content"):
        chunk["choices"][0]["logprobs"] = _logprobs_block(reply, [delta["content"]], index)


@dataclass(frozen=True, slots=True)
class HttpError:
    """Answer with an HTTP error: an OpenAI-style error body (or ``body`` verbatim) and ``Retry-After`` if given."""

    status: int
    message: str = "scripted error"
    retry_after: float | str | None = None
    body: str | None = None


@dataclass(frozen=True, slots=True)
class Stall:
    """Stream ``after``, then send nothing for ``seconds`` (None: until the client goes away), then ``then``.

    A non-streaming request gets no response at all while stalled.
    """

    after: str = ""
    seconds: float | None = None
    then: str = ""


@dataclass(frozen=True, slots=True)
class Drop:
    """Stream ``after``, then cut the connection (a non-streaming request is cut before any response)."""

    after: str = ""


@dataclass(frozen=True, slots=True)
class StreamError:
    """Stream ``after``, then an error event in the stream (what a provider sends when it fails mid-stream: Chat
    Completions' ``{"error": ...}`` chunk, the Responses API's ``error`` and ``response.failed``, Anthropic's
    ``event: error`` such as ``overloaded_error``), then end the body. A non-streaming request gets HTTP ``status``."""

    after: str = ""
    status: int = 500
    message: str = "scripted failure mid-stream"


Reply = Text | HttpError | Stall | Drop | StreamError


@dataclass(frozen=True, slots=True)
class Congestion:
    """An endpoint that degrades under load. With ``c`` chat calls in flight (this one included): past ``knee``, a
    call's time to first token is multiplied and its tokens per second divided by ``(c / knee) ** exponent``
    (``exponent`` > 1: throughput falls past the knee); past ``hard_limit`` it is answered HTTP 429 at once, with
    ``Retry-After: retry_after`` when that is set. The factor is taken when the call arrives."""

    knee: int
    hard_limit: int | None = None
    exponent: float = 2.0
    retry_after: float | None = 1.0

    def __post_init__(self) -> None:
        if self.knee < 1:
            raise ValueError(f"Congestion knee must be at least 1, got {self.knee}")
        if self.hard_limit is not None and self.hard_limit < self.knee:
            raise ValueError(f"Congestion hard_limit {self.hard_limit} is below the knee {self.knee}")

    def slowdown(self, concurrency: int) -> float:
        return float(max(1.0, concurrency / self.knee) ** self.exponent)


@dataclass(slots=True)
class ServedCall:
    """One chat call as the server saw it: when it arrived and ended (loop time), its HTTP status, how many chat
    calls were in flight when it arrived (itself included), and the tokens it was billed (0 for errors; a stream's
    prompt once it started and each token it sent, also when the stream was cut)."""

    started: float
    concurrency: int
    ended: float | None = None
    status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the server received: ``body`` is the parsed JSON body (None if there was none or it is not JSON)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    at: float = field(compare=False)

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def response_format(self) -> Any:
        return self.body.get("response_format") if isinstance(self.body, dict) else None

    @property
    def dialect(self) -> Dialect:
        """The API the request was sent to: ``chat`` (``/v1/chat/completions``), ``responses`` or ``anthropic``
        (``/v1/messages``)."""
        path = self.path.rstrip("/")
        path = path[3:] if path.startswith("/v1/") else path
        return PATHS.get(path, "chat")

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages as ``[{"role", "content", ...}]`` in every dialect (a Responses request's
        ``instructions`` and an Anthropic request's ``system`` first, as a system message)."""
        if self.dialect == "chat":
            messages = self.body.get("messages") if isinstance(self.body, dict) else None
            return messages if isinstance(messages, list) else []
        return messages_of(self.dialect, self.body)


ScriptFunction = Callable[[RecordedRequest], Reply | Awaitable[Reply]]


def reply_from_json(obj: Mapping[str, Any]) -> Reply:
    """A reply from a JSON object (one line of a ``--script`` file).

    ``{"text": "..."}``, ``{"json": value}``, ``{"plan": [step, ...]}`` (JSON lines), ``{"status": 429,
    "retry_after": 2}``, ``{"stall": true, "after": "...", "seconds": 5}``, ``{"drop": true, "after": "..."}``,
    ``{"stream_error": 500, "after": "..."}`` (an error event mid-stream); text replies also take ``ttft``,
    ``tokens_per_second``, ``finish_reason``, ``reasoning``, ``cached_tokens``, ``cache_write_tokens`` and
    ``tool_calls`` (``[{"id", "name", "arguments": {...} or "JSON text"}]``).
    """
    if obj.get("stall"):
        return Stall(str(obj.get("after", "")), obj.get("seconds"), str(obj.get("then", "")))
    if obj.get("drop"):
        return Drop(str(obj.get("after", "")))
    if "stream_error" in obj:
        return StreamError(str(obj.get("after", "")), int(obj["stream_error"]),
                           str(obj.get("message", "scripted failure mid-stream")))
    if "status" in obj:
        return HttpError(int(obj["status"]), str(obj.get("message", "scripted error")), obj.get("retry_after"),
                         obj.get("body"))
    timing: dict[str, Any] = {k: obj[k] for k in ("ttft", "tokens_per_second", "finish_reason", "reasoning",
                                                  "cached_tokens", "cache_write_tokens") if k in obj}
    if obj.get("tool_calls"):
        timing["tool_calls"] = tuple(
            Call(str(c.get("id") or f"call_{i}"), str(c["name"]), c["arguments"] if isinstance(c.get("arguments"), str)
                 else orjson.dumps(c.get("arguments") or {}).decode()) for i, c in enumerate(obj["tool_calls"]))
    if "json" in obj:
        return Text(orjson.dumps(obj["json"]).decode(), **timing)
    if "plan" in obj:
        return Text(plan_lines(obj["plan"]), **timing)
    if "text" in obj:
        return Text(str(obj["text"]), **timing)
    raise ValueError(f"not a scripted reply (needs text, json, plan, status, stall or drop): {dict(obj)!r}")


class ScriptedLLM:
    """The server. ``async with`` it to serve (on a free port unless ``port`` is given); it yields the base URL.

    ``json_schema=False`` makes it answer ``response_format`` ``json_schema`` with HTTP 500, as llama.cpp's server
    does (such a rejection takes no reply from the script). ``default`` answers requests after the script has run out;
    without it they get HTTP 410.
    """

    def __init__(
        self,
        script: Iterable[Reply] | ScriptFunction = (),
        *,
        default: Reply | None = None,
        ttft: float = 0.0,
        tokens_per_second: float | None = None,
        json_schema: bool = True,
        models: Sequence[str] = ("scripted",),
        host: str = "127.0.0.1",
        port: int = 0,
        congestion: Congestion | None = None,
        usage_in_every_chunk: bool = False,
        honour_max_tokens: bool = False,
    ) -> None:
        self._function: ScriptFunction | None = script if callable(script) else None
        self._queue: deque[Reply] = deque() if callable(script) else deque(script)
        self.default = default
        self.ttft = ttft
        self.tokens_per_second = tokens_per_second
        self.json_schema = json_schema
        self.models = tuple(models)
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        self.congestion = congestion
        self.usage_in_every_chunk = usage_in_every_chunk
        self.honour_max_tokens = honour_max_tokens
        self.served: list[ServedCall] = []
        self.in_flight = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (the port is known once the server is serving)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def billed_tokens(self) -> int:
        """Every token the server has billed so far: each chat call's prompt and the tokens it sent (cut streams
        and calls still streaming included), as a provider's invoice would count them."""
        return sum(call.tokens for call in self.served)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat completion requests received, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def model_requests(self) -> list[RecordedRequest]:
        """The model calls received in any dialect (chat completions, responses, messages), in order."""
        return [r for r in self.requests if r.method == "POST" and _route(r.path) is not None]

    def push(self, *replies: Reply) -> None:
        """Append replies to the script (a sequence script only)."""
        if self._function is not None:
            raise TypeError("this server's script is a function; it has no queue to push to")
        self._queue.extend(replies)

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.base_url

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening and end every open connection (stalled ones included)."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    # -- HTTP --------------------------------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                received = await self._read_request(conn, reader)
                if received is None:
                    break
                if not await self._respond(conn, reader, writer, received):
                    break
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            if writer.transport.is_closing():
                writer.transport.abort()
            else:
                writer.close()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> RecordedRequest | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None
        assert request is not None
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        recorded = RecordedRequest(
            method=request.method.decode(),
            path=request.target.decode().split("?", 1)[0],
            headers={k.decode().lower(): v.decode() for k, v in request.headers},
            body=parsed,
            at=asyncio.get_running_loop().time(),
        )
        self.requests.append(recorded)
        return recorded

    async def _respond(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: RecordedRequest
    ) -> bool:
        """Answer one request; False if the connection must end."""
        path = req.path.rstrip("/")
        if req.method == "GET" and path in ("/v1/models", "/models"):
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "planweave"} for m in self.models]
            await self._send_json(conn, writer, 200, {"object": "list", "data": data})
            return True
        if req.method != "POST" or _route(path) is None:
            await self._send_json(conn, writer, 404, _error_body(f"no route {req.method} {req.path}", "not_found"))
            return True
        needed = "input" if req.dialect == "responses" else "messages"
        if not isinstance(req.body, dict) or not isinstance(req.body.get(needed), list | str) or (
                needed == "messages" and not isinstance(req.body.get(needed), list)):
            await self._send_json(conn, writer, 400, error_body(req.dialect, 400, f"body must be JSON with '{needed}'"))
            return True
        fmt = req.response_format
        if not self.json_schema and isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            # What llama-cpp-python's server does: its chat handlers accept only text and json_object.
            await self._send_json(conn, writer, 500, _error_body(
                "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
                "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}",
                "internal_server_error"))
            return True
        self.in_flight += 1
        call = ServedCall(asyncio.get_running_loop().time(), self.in_flight)
        self.served.append(call)
        try:
            return await self._chat(conn, reader, writer, req, call)
        finally:
            self.in_flight -= 1
            call.ended = asyncio.get_running_loop().time()

    async def _chat(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    req: RecordedRequest, call: ServedCall) -> bool:
        """Answer one chat call (recorded in ``call``); False if the connection must end."""
        congestion = self.congestion
        slowdown = 1.0
        if congestion is not None:
            if congestion.hard_limit is not None and call.concurrency > congestion.hard_limit:
                call.status = 429
                await self._send_error(conn, writer, HttpError(
                    429, f"overloaded: {call.concurrency} calls in flight, limit {congestion.hard_limit}",
                    retry_after=congestion.retry_after), req.dialect)
                return True
            slowdown = congestion.slowdown(call.concurrency)
        reply = self._within_max_tokens(req, await self._next_reply(req))
        if isinstance(reply, StreamError) and not req.stream:
            reply = HttpError(reply.status, reply.message)
        call.status = reply.status if isinstance(reply, HttpError) else 200
        if isinstance(reply, HttpError):
            await self._send_error(conn, writer, reply, req.dialect)
            return True
        if isinstance(reply, Drop) and not req.stream:
            writer.transport.abort()
            return False
        if isinstance(reply, Stall) and not req.stream:
            if not await self._stall(reader, reply.seconds):
                return False
            reply = Text(reply.after + reply.then)
        if req.stream:
            return await self._stream(conn, reader, writer, req, reply, call, slowdown)
        assert isinstance(reply, Text)
        await self._complete(conn, writer, req, reply, call, slowdown)
        return True

    def _within_max_tokens(self, req: RecordedRequest, reply: Reply) -> Reply:
        """``reply`` cut at the request's max_tokens (finish_reason "length") when the server honours it."""
        body = req.body if isinstance(req.body, dict) else {}
        limit = body.get("max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens")))
        if not self.honour_max_tokens or not isinstance(limit, int) or not isinstance(reply, Text):
            return reply
        pieces = split_tokens(reply.text)
        if len(pieces) <= limit:
            return reply
        return dataclasses.replace(reply, text="".join(pieces[:limit]), finish_reason="length")

    async def _next_reply(self, req: RecordedRequest) -> Reply:
        if self._function is not None:
            result = self._function(req)
            return await result if inspect.isawaitable(result) else result
        if self._queue:
            return self._queue.popleft()
        if self.default is not None:
            return self.default
        n = len(self.chat_requests)
        return HttpError(410, f"scripted server: the script has no reply left for chat request #{n}")

    async def _send_json(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: Any,
                         headers: Sequence[tuple[str, str]] = ()) -> None:
        data = orjson.dumps(body)
        hdrs = [("content-type", "application/json"), ("content-length", str(len(data))), *headers]
        writer.write(conn.send(h11.Response(status_code=status, headers=hdrs)))
        writer.write(conn.send(h11.Data(data=data)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _send_error(self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: HttpError,
                          dialect: Dialect = "chat") -> None:
        headers = [] if reply.retry_after is None else [("retry-after", _retry_after_text(reply.retry_after))]
        if reply.body is not None:
            data = reply.body.encode()
            hdrs = [("content-type", "text/plain"), ("content-length", str(len(data))), *headers]
            writer.write(conn.send(h11.Response(status_code=reply.status, headers=hdrs)))
            writer.write(conn.send(h11.Data(data=data)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            return
        await self._send_json(conn, writer, reply.status, error_body(dialect, reply.status, reply.message), headers)

    async def _stall(self, reader: asyncio.StreamReader, seconds: float | None) -> bool:
        """Send nothing for ``seconds`` (None: until the client closes); False if the client went away."""
        if seconds is not None:
            await asyncio.sleep(seconds)
            return True
        while await reader.read(65536):
            pass  # a client waiting for this response sends nothing more; EOF means it gave up
        return False

    # -- replies, in the request's dialect ------------------------------------------------------------------------
    def _usage(self, req: RecordedRequest, reply: Text, completion_tokens: int,
               call: ServedCall | None = None, reasoning_tokens: int = 0) -> Tokens:
        prompt = reply.prompt_tokens
        if prompt is None:
            prompt = sum(math.ceil(len(str(m.get("content") or "")) / 4) + 4 for m in req.messages) + 2
        completion = reply.completion_tokens if reply.completion_tokens is not None else completion_tokens
        if call is not None:
            call.prompt_tokens, call.completion_tokens = prompt, completion
        return Tokens(prompt, completion, min(reply.cached_tokens, prompt),
                      min(reply.cache_write_tokens, max(0, prompt - reply.cached_tokens)), reasoning_tokens)

    def _model(self, req: RecordedRequest) -> str:
        model = req.body.get("model") if isinstance(req.body, dict) else None
        return model if isinstance(model, str) and model else self.models[0]

    @staticmethod
    def _shape(req: RecordedRequest, reply: Text) -> tuple[str, tuple[Call, ...], str]:
        """The text, tool calls and finish reason to send: a request forcing a tool (Anthropic's structured output)
        gets the scripted text as that tool's input."""
        forced = forced_tool(req.body) if req.dialect == "anthropic" else None
        text, calls = reply.text, tuple(reply.tool_calls)
        if forced is not None and not calls:
            text, calls = "", (Call(f"toolu_scripted_{forced}", forced, reply.text),)
        finish = "tool_calls" if calls and reply.finish_reason == "stop" else reply.finish_reason
        return text, calls, finish

    async def _complete(self, conn: h11.Connection, writer: asyncio.StreamWriter, req: RecordedRequest,
                        reply: Text, call: ServedCall, slowdown: float = 1.0) -> None:
        text, calls, finish = self._shape(req, reply)
        pieces = split_tokens(text)
        thought = len(split_tokens(reply.reasoning))
        produced = len(pieces) + thought + sum(len(split_tokens(c.arguments)) for c in calls)
        ttft = (self.ttft if reply.ttft is None else reply.ttft) * slowdown
        tps = self.tokens_per_second if reply.tokens_per_second is None else reply.tokens_per_second
        tps = tps / slowdown if tps else tps
        delay = ttft + (produced / tps if tps else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        usage = self._usage(req, reply, produced, call, thought)
        given = usage if reply.usage else None
        rid = f"scripted-{next(self._ids)}"
        if req.dialect == "responses":
            await self._send_json(conn, writer, 200, responses_body(
                f"resp_{rid}", self._model(req), text, reply.reasoning, calls, finish, given))
            return
        if req.dialect == "anthropic":
            await self._send_json(conn, writer, 200, anthropic_body(
                f"msg_{rid}", self._model(req), text, reply.reasoning, calls, finish, given))
            return
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        body: dict[str, Any] = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._model(req),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if _asks_logprobs(req, reply):
            body["choices"][0]["logprobs"] = _logprobs_block(reply, pieces, 0)
        if reply.usage:
            body["usage"] = usage.chat()
        await self._send_json(conn, writer, 200, body)

    def _encoder(self, req: RecordedRequest, model: str, timing: Text, every: bool) -> StreamEncoder:
        rid = f"scripted-{next(self._ids)}"
        if req.dialect == "responses":
            return ResponsesEncoder(f"resp_{rid}", model)
        if req.dialect == "anthropic":
            return AnthropicEncoder(f"msg_{rid}", model)
        return ChatEncoder(f"chatcmpl-{rid}", model, timing if _asks_logprobs(req, timing) else None, every)

    def _usage_options(self, req: RecordedRequest, timing: Text) -> tuple[bool, bool]:
        """Whether a stream carries the usage so far in every text event, and the usage at its end."""
        options = req.body.get("stream_options") if isinstance(req.body, dict) else None
        options = options if isinstance(options, dict) else {}
        every = req.dialect == "chat" and timing.usage and (
            self.usage_in_every_chunk or bool(options.get("continuous_usage_stats")))
        # Chat Completions sends usage only when asked (include_usage); the other dialects always do
        return every, timing.usage and (req.dialect != "chat" or bool(options.get("include_usage")))

    async def _stream(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      req: RecordedRequest, reply: Reply, call: ServedCall, slowdown: float = 1.0) -> bool:
        assert not isinstance(reply, HttpError)
        timing = reply if isinstance(reply, Text) else Text("")
        text, calls, _ = self._shape(req, reply) if isinstance(reply, Text) else (reply.after, (), "stop")
        ttft = (self.ttft if timing.ttft is None else timing.ttft) * slowdown
        tps = self.tokens_per_second if timing.tokens_per_second is None else timing.tokens_per_second
        tps = tps / slowdown if tps else tps
        model = self._model(req)
        loop = asyncio.get_running_loop()

        every, final_usage = self._usage_options(req, timing)
        billed = dataclasses.replace(timing, completion_tokens=None)
        encoder = self._encoder(req, model, timing, every)
        thought = 0

        def sent_so_far() -> Tokens:
            return self._usage(req, billed, call.completion_tokens, None, thought)

        async def send_pieces(pieces: list[str], frame: Callable[[str], bytes]) -> None:
            start = loop.time()
            due: list[bytes] = []  # events whose time has come go out in one write
            for i, piece in enumerate(pieces):
                if tps:
                    wait = start + i / tps - loop.time()
                    if wait > 0:
                        if due:
                            writer.write(conn.send(h11.Data(data=b"".join(due))))
                            due.clear()
                            await writer.drain()
                        await asyncio.sleep(wait)
                call.completion_tokens += 1  # billed as it is sent: a cut stream still costs what it sent
                due.append(frame(piece))
            if due:
                writer.write(conn.send(h11.Data(data=b"".join(due))))
            await writer.drain()

        def text_frame(piece: str) -> bytes:
            return encoder.text(piece, sent_so_far() if every else None)

        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
        writer.write(conn.send(h11.Data(data=encoder.start(self._usage(req, billed, 0, call)))))
        await writer.drain()  # the prompt is billed once generation starts
        if ttft > 0:
            await asyncio.sleep(ttft)
        reasoning = split_tokens(timing.reasoning)
        await send_pieces(reasoning, encoder.reasoning)
        thought = len(reasoning)
        pieces = split_tokens(text)
        await send_pieces(pieces, text_frame)
        if isinstance(reply, Drop):
            writer.transport.abort()
            return False
        if isinstance(reply, StreamError):
            writer.write(conn.send(h11.Data(data=encoder.error(reply.status, reply.message))))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            return True
        if isinstance(reply, Stall):
            if not await self._stall(reader, reply.seconds):
                return False
            more = split_tokens(reply.then)
            await send_pieces(more, text_frame)
            pieces += more
            reply = Text(reply.after + reply.then)
        arguments = 0
        for index, tool in enumerate(calls):
            writer.write(conn.send(h11.Data(data=encoder.tool_start(index, tool))))
            parts = split_tokens(tool.arguments)
            await send_pieces(parts, functools.partial(encoder.tool_arguments, index, tool))
            arguments += len(parts)
        finish = "tool_calls" if calls and reply.finish_reason == "stop" else reply.finish_reason
        usage = self._usage(req, reply, len(pieces) + thought + arguments, call, thought)
        writer.write(conn.send(h11.Data(data=encoder.end(finish, usage if final_usage else None))))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        return True


class ChatEncoder:
    """A streamed Chat Completions reply: ``chat.completion.chunk`` events, a usage chunk when asked, ``[DONE]``."""

    def __init__(self, cid: str, model: str, logprobs: Text | None, every: bool) -> None:
        self.cid, self.model, self.created = cid, model, int(time.time())
        self.logprobs = logprobs  # the reply whose logprobs to send (None: the request asked for none)
        self.every = every
        self.index = 0

    def _chunk(self, delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": self.cid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    @staticmethod
    def _data(chunk: Mapping[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def start(self, usage: Tokens) -> bytes:
        return self._data(self._chunk({"role": "assistant", "content": ""}))

    def reasoning(self, piece: str) -> bytes:
        return self._data(self._chunk({"reasoning_content": piece}))

    def text(self, piece: str, usage: Tokens | None) -> bytes:
        delta = {"content": piece}
        chunk = self._chunk(delta)
        _add_logprobs(chunk, self.logprobs, delta, self.index)
        self.index += 1
        if usage is not None:
            chunk["usage"] = usage.chat()
        return self._data(chunk)

    def tool_start(self, index: int, call: Call) -> bytes:
        return self._data(self._chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                        "function": {"name": call.name, "arguments": ""}}]}))

    def tool_arguments(self, index: int, call: Call, piece: str) -> bytes:
        return self._data(self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))

    def error(self, status: int, message: str) -> bytes:
        return self._data({"error": {"message": message, "type": "server_error", "code": str(status)}})

    def end(self, finish: str, usage: Tokens | None) -> bytes:
        out = self._data(self._chunk({}, finish))
        if usage is not None:
            out += self._data({"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                               "model": self.model, "choices": [], "usage": usage.chat()})
        return out + b"data: [DONE]\n\n"


def _route(path: str) -> Dialect | None:
    """The dialect served at ``path`` (with or without ``/v1``), None for no model route."""
    path = path.rstrip("/")
    return PATHS.get(path[3:] if path.startswith("/v1/") else path)


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def _retry_after_text(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else str(value)


def load_script(path: str | Path) -> list[Reply]:
    """Replies from a JSON-lines file (blank lines and lines starting with ``#`` are skipped)."""
    replies = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            replies.append(reply_from_json(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    return replies


@dataclass(frozen=True)
class _ServeOptions:
    host: str
    port: int
    script: str | None
    loop: bool
    text: str | None
    ttft: float
    tps: float | None
    no_json_schema: bool
    model: list[str] | None
    knee: int | None
    hard_limit: int | None


async def _serve(args: _ServeOptions) -> None:
    replies = load_script(args.script) if args.script else []
    script: Iterable[Reply] | ScriptFunction = replies
    default: Reply | None = Text(args.text) if args.text is not None else None
    if args.loop and replies:
        cycle = itertools.cycle(replies)
        script = lambda _request: next(cycle)  # noqa: E731
    server = ScriptedLLM(script, default=default, ttft=args.ttft, tokens_per_second=args.tps,
                         json_schema=not args.no_json_schema, models=tuple(args.model or ["scripted"]),
                         host=args.host, port=args.port,
                         congestion=Congestion(args.knee, args.hard_limit) if args.knee else None)
    async with server as base_url:
        print(f"scripted LLM server at {base_url} ({len(replies)} scripted replies)", flush=True)
        await asyncio.Event().wait()


def _serve_command(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    script: Annotated[str | None, typer.Option(help="JSON-lines file of replies")] = None,
    loop: Annotated[bool, typer.Option("--loop", help="repeat the script forever")] = False,
    text: Annotated[str | None, typer.Option(help="reply with this text once the script has run out")] = None,
    ttft: Annotated[float, typer.Option(help="seconds before the first token")] = 0.0,
    tps: Annotated[float | None, typer.Option(help="tokens per second (default: as fast as possible)")] = None,
    no_json_schema: Annotated[bool, typer.Option("--no-json-schema",
                                                 help="answer json_schema response_format with 500")] = False,
    model: Annotated[list[str] | None, typer.Option(help="model name listed by /v1/models (repeatable)")] = None,
    knee: Annotated[int | None, typer.Option(help="congestion: calls in flight before it slows down")] = None,
    hard_limit: Annotated[int | None, typer.Option(help="congestion: calls in flight past which: 429")] = None,
) -> None:
    """A scripted OpenAI-compatible server for tests and benchmarks."""
    options = _ServeOptions(host, port, script, loop, text, ttft, tps, no_json_schema, model, knee, hard_limit)
    try:
        asyncio.run(_serve(options))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the server until interrupted (``python -m planweave.testing.scripted_llm --help``)."""
    import typer.main

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(_serve_command)
    typer.main.get_command(app).main(args=list(sys.argv[1:] if argv is None else argv),
                                     prog_name="python -m planweave.testing.scripted_llm")


if __name__ == "__main__":
    main()
