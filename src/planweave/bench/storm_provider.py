"""A metered OpenAI-compatible provider on 127.0.0.1 for the storm and caps benchmarks: rate limits, cuts, invoice.

It answers ``POST /v1/chat/completions`` (streamed as server-sent events, or not; text or one tool call) over real
HTTP/1.1 (asyncio streams and h11, as :mod:`planweave.testing.scripted_llm` does), and behaves like a provider's
account:

* **tokens per minute**, a token bucket as providers describe theirs: it holds ``tokens_per_minute`` tokens, refills
  continuously at that rate, and a request takes its prompt (counted like :func:`~planweave.models.pricing.
  approx_prompt_tokens`) plus its ``max_tokens`` (else the length of its reply) when it arrives; one that does not fit
  is answered HTTP 429 with ``Retry-After`` (seconds, a decimal) saying when it would;
* **concurrency**: past ``max_concurrency`` requests in flight, HTTP 429 with ``Retry-After: concurrency_retry_after``;
* **cuts**: a :class:`Cut` reply stops after ``fraction`` of its tokens, the connection dropped mid-stream (a
  non-streamed request gets HTTP 500 once that much was generated);
* **an invoice**: every attempt is kept in :attr:`MeteredProvider.attempts` with the tokens it billed (its prompt once
  generation starts, each token as it is sent: a cut call is billed what it generated; a 429 bills nothing), and
  :meth:`MeteredProvider.invoice_usd` prices them at the provider's own price, whatever the client knows.

Which reply a request gets is the ``script``'s choice: a function of the :class:`ChatCall` (its ``key``, read from a
``[call KEY]`` tag in its messages, and how many times that key was sent before), so a seeded failure schedule is the
same for every client whatever order their requests arrive in. Time is the running loop's: on the virtual clock
(:func:`planweave.core.clock.run_virtual`) a storm that takes minutes of provider time runs in seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import h11
import orjson

from planweave.testing.scripted_llm import split_tokens

__all__ = ["Attempt", "ChatCall", "Cut", "MeteredProvider", "ProviderLimits", "Say", "ToolCall", "call_tag"]

_KEY = re.compile(r"\[call ([A-Za-z0-9_.:-]+)\]")


def call_tag(key: str) -> str:
    """The tag a prompt carries so the provider knows which logical call (and which attempt of it) a request is."""
    return f"[call {key}]"


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """The account's limits: ``tokens_per_minute`` (a bucket refilled continuously) and ``max_concurrency`` requests
    in flight (None: no limit); ``concurrency_retry_after`` is the Retry-After of a 429 for concurrency."""

    tokens_per_minute: int | None = None
    max_concurrency: int | None = None
    concurrency_retry_after: float = 1.0


@dataclass(frozen=True, slots=True)
class Say:
    """Answer ``text``."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """Answer with one call of tool ``name`` with ``arguments`` (a JSON object), and ``text`` worth of tokens of
    reasoning billed as output (not sent)."""

    name: str
    arguments: Mapping[str, Any]
    text: str = ""


@dataclass(frozen=True, slots=True)
class Cut:
    """Start answering ``text`` and stop after ``fraction`` of its tokens (see the module)."""

    text: str
    fraction: float = 0.5


Answer = Say | ToolCall | Cut


@dataclass(frozen=True, slots=True)
class ChatCall:
    """A chat request as the script sees it: its call ``key`` (None without a tag), ``attempt`` (1 for the first
    request of that key), ``turn`` (assistant messages already in it: the agent loop's turn, from 0), the model,
    whether it streams, its ``max_tokens`` and its prompt tokens."""

    key: str | None
    attempt: int
    turn: int
    model: str
    stream: bool
    max_tokens: int | None
    prompt_tokens: int


@dataclass(slots=True)
class Attempt:
    """One request as the provider saw and billed it; ``status`` 200 with ``cut`` False is a completed call."""

    key: str | None
    attempt: int
    model: str
    started: float
    status: int | None = None
    cut: bool = False
    ended: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finished: bool = False  # the whole answer was sent

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.finished


def _prompt_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        return 2
    total = 2
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts: their text
            content = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
        total += math.ceil(len(str(content or "")) / 4) + 4
    return total


Script = Callable[[ChatCall], Answer]


class MeteredProvider:
    """The provider (see the module); ``async with`` it to serve on a free port: it yields the base URL (``/v1``).

    ``prices`` maps a model name to its USD per million (input, output) tokens, for :meth:`invoice_usd`.
    """

    def __init__(self, script: Script, *, limits: ProviderLimits = ProviderLimits(), ttft: float = 0.2,
                 tokens_per_second: float = 50.0, prices: Mapping[str, tuple[float, float]] | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if limits.tokens_per_minute is not None and limits.tokens_per_minute < 1:
            raise ValueError(f"tokens_per_minute must be at least 1, got {limits.tokens_per_minute}")
        if tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be above 0, got {tokens_per_second}")
        self.script = script
        self.limits = limits
        self.ttft = ttft
        self.tokens_per_second = tokens_per_second
        self.prices = dict(prices or {})
        self.host = host
        self.port = port
        self.attempts: list[Attempt] = []
        self.in_flight = 0
        self._sent: dict[str | None, int] = {}
        self._bucket = float(limits.tokens_per_minute or 0)
        self._bucket_at: float | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    # -- what it billed --------------------------------------------------------------------------------------------
    @property
    def rate_limited(self) -> int:
        return sum(1 for a in self.attempts if a.status == 429)

    @property
    def billed_tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)

    def invoice_usd(self) -> float:
        """What the attempts cost at the provider's prices (a model without one costs 0 here: give it one)."""
        total = 0.0
        for a in self.attempts:
            price_in, price_out = self.prices.get(a.model, (0.0, 0.0))
            total += (a.prompt_tokens * price_in + a.completion_tokens * price_out) / 1_000_000
        return total

    # -- serving ---------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"http://{self.host}:{self.port}/v1"

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read(conn, reader)
                if request is None or not await self._respond(conn, writer, *request):
                    break
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.transport.abort()

    async def _read(self, conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[str, Any] | None:
        target = ""
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                target = event.target.decode()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None
        try:
            return target, orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            return target, None

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: Any,
                    headers: list[tuple[str, str]] | None = None) -> None:
        data = orjson.dumps(body)
        hdrs = [("content-type", "application/json"), ("content-length", str(len(data))), *(headers or [])]
        writer.write(conn.send(h11.Response(status_code=status, headers=hdrs)))
        writer.write(conn.send(h11.Data(data=data)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _too_many(self, conn: h11.Connection, writer: asyncio.StreamWriter, attempt: Attempt, message: str,
                        retry_after: float) -> bool:
        attempt.status = 429
        attempt.ended = asyncio.get_running_loop().time()
        await self._send(conn, writer, 429, {"error": {"message": message, "type": "rate_limit_exceeded",
                                                       "code": "rate_limit_exceeded"}},
                         [("retry-after", f"{retry_after:.3f}")])
        return True

    def _take_tokens(self, need: int, now: float) -> float | None:
        """Take ``need`` tokens from the bucket: None if they were there, else the seconds until they would be."""
        tpm = self.limits.tokens_per_minute
        if tpm is None:
            return None
        rate = tpm / 60.0
        if self._bucket_at is not None:
            self._bucket = min(float(tpm), self._bucket + (now - self._bucket_at) * rate)
        self._bucket_at = now
        if need <= self._bucket:
            self._bucket -= need
            return None
        return (min(need, tpm) - self._bucket) / rate

    async def _respond(self, conn: h11.Connection, writer: asyncio.StreamWriter, target: str, body: Any) -> bool:
        if not target.split("?")[0].rstrip("/").endswith("/chat/completions") or not isinstance(body, dict):
            await self._send(conn, writer, 404, {"error": {"message": f"no route {target}", "type": "not_found"}})
            return True
        messages = body.get("messages")
        text = orjson.dumps(messages).decode() if messages is not None else ""
        found = _KEY.search(text)
        key = found.group(1) if found else None
        sent = self._sent[key] = self._sent.get(key, 0) + 1
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = max_tokens if isinstance(max_tokens, int) else None
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant") \
            if isinstance(messages, list) else 0
        call = ChatCall(key, sent, turn, str(body.get("model") or "model"), bool(body.get("stream")), max_tokens,
                        _prompt_tokens(messages))
        loop = asyncio.get_running_loop()
        attempt = Attempt(key, sent, call.model, loop.time())
        self.attempts.append(attempt)
        self.in_flight += 1
        try:
            limit = self.limits.max_concurrency
            if limit is not None and self.in_flight > limit:
                return await self._too_many(conn, writer, attempt, f"{self.in_flight} requests in flight, limit "
                                            f"{limit}", self.limits.concurrency_retry_after)
            answer = self.script(call)
            pieces = split_tokens(answer.name if isinstance(answer, ToolCall) else answer.text)
            wait = self._take_tokens(call.prompt_tokens + (max_tokens if max_tokens is not None else len(pieces)),
                                     loop.time())
            if wait is not None:
                return await self._too_many(conn, writer, attempt, "tokens per minute exceeded", wait)
            if call.stream:
                return await self._stream(conn, writer, call, answer, attempt)
            await self._complete(conn, writer, call, answer, attempt)
            return True
        finally:
            self.in_flight -= 1
            if attempt.ended is None:
                attempt.ended = loop.time()

    def _usage(self, attempt: Attempt) -> dict[str, int]:
        return {"prompt_tokens": attempt.prompt_tokens, "completion_tokens": attempt.completion_tokens,
                "total_tokens": attempt.tokens}

    async def _complete(self, conn: h11.Connection, writer: asyncio.StreamWriter, call: ChatCall, answer: Answer,
                        attempt: Attempt) -> None:
        text = answer.text
        pieces = split_tokens(text)
        if isinstance(answer, Cut):
            pieces = pieces[:math.floor(len(pieces) * answer.fraction)]
        if call.max_tokens is not None:
            pieces = pieces[:call.max_tokens]
        attempt.prompt_tokens = call.prompt_tokens
        await asyncio.sleep(self.ttft + len(pieces) / self.tokens_per_second)
        attempt.completion_tokens = len(pieces)
        if isinstance(answer, Cut):
            attempt.status, attempt.cut = 500, True
            await self._send(conn, writer, 500, {"error": {"message": "the server had an error while generating",
                                                           "type": "server_error"}})
            return
        message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
        finish = "stop"
        if isinstance(answer, ToolCall):
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{next(self._ids)}", "type": "function",
                "function": {"name": answer.name, "arguments": orjson.dumps(dict(answer.arguments)).decode()}}]}
            finish = "tool_calls"
        attempt.status = 200
        await self._send(conn, writer, 200, {
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": call.model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": self._usage(attempt)})
        attempt.finished = True

    async def _stream(self, conn: h11.Connection, writer: asyncio.StreamWriter, call: ChatCall, answer: Answer,
                      attempt: Attempt) -> bool:
        if isinstance(answer, ToolCall):
            raise ValueError("the metered provider streams text only")
        loop = asyncio.get_running_loop()
        cid, created = f"chatcmpl-{next(self._ids)}", int(time.time())
        pieces = split_tokens(answer.text)
        cut_at = math.floor(len(pieces) * answer.fraction) if isinstance(answer, Cut) else None
        if call.max_tokens is not None:
            pieces = pieces[:call.max_tokens]

        def event(delta: Mapping[str, Any], finish: str | None = None) -> bytes:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": call.model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        attempt.status = 200
        writer.write(conn.send(h11.Response(status_code=200, headers=[("content-type", "text/event-stream")])))
        writer.write(conn.send(h11.Data(data=event({"role": "assistant", "content": ""}))))
        await writer.drain()
        await asyncio.sleep(self.ttft)
        attempt.prompt_tokens = call.prompt_tokens  # billed once generation starts
        start = loop.time()
        for i, piece in enumerate(pieces):
            if cut_at is not None and i >= cut_at:
                attempt.cut = True
                writer.transport.abort()
                return False
            wait = start + (i + 1) / self.tokens_per_second - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            attempt.completion_tokens += 1
            writer.write(conn.send(h11.Data(data=event({"content": piece}))))
        finish = "length" if call.max_tokens is not None and len(pieces) == call.max_tokens and cut_at is None \
            and len(split_tokens(answer.text)) > call.max_tokens else "stop"
        tail = event({}, finish)
        tail += b"data: " + orjson.dumps({"id": cid, "object": "chat.completion.chunk", "created": created,
                                          "model": call.model, "choices": [], "usage": self._usage(attempt)}) + b"\n\n"
        writer.write(conn.send(h11.Data(data=tail + b"data: [DONE]\n\n")))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        attempt.finished = True
        attempt.ended = loop.time()
        return True
