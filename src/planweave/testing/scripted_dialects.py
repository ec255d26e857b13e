"""How the scripted server writes a reply in each dialect: Chat Completions, the Responses API, Anthropic Messages.

:class:`~planweave.testing.scripted_llm.ScriptedLLM` decides *what* to send and *when* (the script, timings, cuts,
stalls, billing); an encoder here decides the bytes: one per streamed call (:class:`StreamEncoder`, stateful: item
ids, block indexes, sequence numbers) and :func:`body` for a whole reply. The shapes follow the providers' API
references closely enough that the official ``openai`` and ``anthropic`` SDKs parse every scenario
(tests/models/test_sdk_fidelity.py). Usage is given to encoders in one neutral shape, :class:`Tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

Dialect = Literal["chat", "responses", "anthropic"]
#: The path (under ``/v1``) of each dialect's endpoint.
PATHS: dict[str, Dialect] = {"/chat/completions": "chat", "/responses": "responses", "/messages": "anthropic"}
_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass(frozen=True, slots=True)
class Tokens:
    """A call's usage: ``prompt`` counts every input token (cache reads and writes included), ``completion``
    every output token (reasoning included)."""

    prompt: int
    completion: int
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0

    def chat(self) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                                 "total_tokens": self.prompt + self.completion}
        if self.cached:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        if self.reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning}
        return usage

    def responses(self) -> dict[str, Any]:
        return {"input_tokens": self.prompt, "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": self.completion, "output_tokens_details": {"reasoning_tokens": self.reasoning},
                "total_tokens": self.prompt + self.completion}

    def anthropic(self) -> dict[str, Any]:
        return {"input_tokens": max(0, self.prompt - self.cached - self.cache_write),
                "cache_read_input_tokens": self.cached, "cache_creation_input_tokens": self.cache_write,
                "output_tokens": self.completion}


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call to send: its id, function name and JSON arguments text."""

    id: str
    name: str
    arguments: str


class StreamEncoder(Protocol):
    """The frames of one streamed reply, in the order the server calls these."""

    def start(self, usage: Tokens) -> bytes: ...
    def reasoning(self, piece: str) -> bytes: ...
    def text(self, piece: str, usage: Tokens | None) -> bytes: ...
    def tool_start(self, index: int, call: Call) -> bytes: ...
    def tool_arguments(self, index: int, call: Call, piece: str) -> bytes: ...
    def end(self, finish: str, usage: Tokens | None) -> bytes: ...
    def error(self, status: int, message: str) -> bytes: ...


def sse(data: Mapping[str, Any], event: str | None = None) -> bytes:
    """One server-sent event: ``event:`` (named dialects) and ``data:`` lines."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


# -- the Responses API ----------------------------------------------------------------------------------------------
class ResponsesEncoder:
    """A streamed Responses API reply: ``response.created`` ... ``response.completed``, items opened as they come."""

    def __init__(self, rid: str, model: str) -> None:
        self.rid, self.model, self.created = rid, model, int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text_so_far = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        frame = sse({"type": kind, "sequence_number": self.seq, **fields}, kind)
        self.seq += 1
        return frame

    def _response(self, status: str, usage: Tokens | None = None, finish: str = "stop") -> dict[str, Any]:
        incomplete = status == "incomplete"
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": list(self.output), "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "usage": usage.responses() if usage is not None else None}

    def start(self, usage: Tokens) -> bytes:
        return (self._event("response.created", response=self._response("in_progress"))
                + self._event("response.in_progress", response=self._response("in_progress")))

    def _close(self) -> bytes:
        item = self.open
        if item is None:
            return b""
        self.open = None
        index = len(self.output)
        out = b""
        if item["type"] == "message":
            text = self.text_so_far
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = {**item, "status": "completed", "content": [part]}
            out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)
        elif item["type"] == "reasoning":
            text = item.pop("_text")
            part = {"type": "summary_text", "text": text}
            item = {**item, "summary": [part]}
            out += self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                               summary_index=0, text=text)
            out += self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                               summary_index=0, part=part)
        elif item["type"] == "function_call":
            item = {**item, "status": "completed"}
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=item["arguments"])
        self.output.append(item)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _open(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self.open = item
        index = len(self.output)
        shown = {k: v for k, v in item.items() if not k.startswith("_")}
        out += self._event("response.output_item.added", output_index=index, item=shown)
        if item["type"] == "message":
            out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                      "logprobs": []})
        elif item["type"] == "reasoning":
            out += self._event("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                               summary_index=0, part={"type": "summary_text", "text": ""})
        return out

    def reasoning(self, piece: str) -> bytes:
        out = b""
        if self.open is None or self.open["type"] != "reasoning":
            out += self._open({"type": "reasoning", "id": f"rs_{self.rid}_{len(self.output)}", "summary": [],
                               "_text": ""})
        assert self.open is not None
        self.open["_text"] += piece
        return out + self._event("response.reasoning_summary_text.delta", item_id=self.open["id"],
                                 output_index=len(self.output), summary_index=0, delta=piece)

    def _message(self) -> bytes:
        if self.open is not None and self.open["type"] == "message":
            return b""
        return self._open({"type": "message", "id": f"msg_{self.rid}_{len(self.output)}", "status": "in_progress",
                           "role": "assistant", "content": []})

    def text(self, piece: str, usage: Tokens | None) -> bytes:
        out = self._message()
        assert self.open is not None
        self.text_so_far += piece
        return out + self._event("response.output_text.delta", item_id=self.open["id"],
                                 output_index=len(self.output), content_index=0, delta=piece, logprobs=[])

    def tool_start(self, index: int, call: Call) -> bytes:
        return self._open({"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
                           "arguments": "", "status": "in_progress"})

    def tool_arguments(self, index: int, call: Call, piece: str) -> bytes:
        assert self.open is not None
        self.open["arguments"] += piece
        return self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                           output_index=len(self.output), delta=piece)

    def error(self, status: int, message: str) -> bytes:
        code = "rate_limit_exceeded" if status == 429 else "server_error"
        response = {**self._response("failed"), "error": {"code": code, "message": message}}
        return (self._event("error", code=code, message=message, param=None)
                + self._event("response.failed", response=response))

    def end(self, finish: str, usage: Tokens | None) -> bytes:
        out = b""
        if not any(item["type"] in ("message", "function_call") for item in [*self.output, self.open or {}]):
            out += self._message()  # an empty reply is still a message
        out += self._close()
        status = "incomplete" if finish == "length" else "completed"
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._event(kind, response=self._response(status, usage, finish))


def responses_body(rid: str, model: str, text: str, reasoning: str, calls: Sequence[Call], finish: str,
                   usage: Tokens | None) -> dict[str, Any]:
    """A whole Responses API reply (``POST /v1/responses`` without ``stream``)."""
    encoder = ResponsesEncoder(rid, model)
    if reasoning:
        encoder.reasoning(reasoning)
    if text or not calls:
        encoder.text(text, None)
    for i, call in enumerate(calls):
        encoder.tool_start(i, call)
        encoder.tool_arguments(i, call, call.arguments)
    encoder._close()
    return encoder._response("incomplete" if finish == "length" else "completed", usage, finish)


# -- Anthropic Messages ---------------------------------------------------------------------------------------------
class AnthropicEncoder:
    """A streamed Messages reply: ``message_start``, content blocks (thinking, text, tool_use), ``message_delta``
    with the output tokens and the stop reason, ``message_stop``."""

    def __init__(self, mid: str, model: str) -> None:
        self.mid, self.model = mid, model
        self.index = -1
        self.block: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, kind)

    def start(self, usage: Tokens) -> bytes:
        start_usage = Tokens(usage.prompt, 1, usage.cached, usage.cache_write).anthropic()
        message: dict[str, Any] = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model,
                                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}
        return self._event("message_start", message=message) + self._event("ping")

    def _switch(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._stop_block()
        self.index += 1
        self.block = kind
        return out + self._event("content_block_start", index=self.index, content_block=block)

    def _stop_block(self) -> bytes:
        if self.block is None:
            return b""
        out = b""
        if self.block == "thinking":
            out += self._event("content_block_delta", index=self.index,
                               delta={"type": "signature_delta", "signature": "scripted-signature"})
        self.block = None
        return out + self._event("content_block_stop", index=self.index)

    def reasoning(self, piece: str) -> bytes:
        out = b"" if self.block == "thinking" else self._switch("thinking", {"type": "thinking", "thinking": "",
                                                                             "signature": ""})
        return out + self._event("content_block_delta", index=self.index,
                                 delta={"type": "thinking_delta", "thinking": piece})

    def text(self, piece: str, usage: Tokens | None) -> bytes:
        out = b"" if self.block == "text" else self._switch("text", {"type": "text", "text": ""})
        return out + self._event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": piece})

    def tool_start(self, index: int, call: Call) -> bytes:
        return self._switch("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})

    def tool_arguments(self, index: int, call: Call, piece: str) -> bytes:
        return self._event("content_block_delta", index=self.index,
                           delta={"type": "input_json_delta", "partial_json": piece})

    def error(self, status: int, message: str) -> bytes:
        return self._event("error", error=error_body("anthropic", 529 if status >= 500 else status, message)["error"])

    def end(self, finish: str, usage: Tokens | None) -> bytes:
        out = self._stop_block()
        final = usage.anthropic() if usage is not None else {"output_tokens": 0}
        out += self._event("message_delta", delta={"stop_reason": _ANTHROPIC_STOP.get(finish, finish),
                                                   "stop_sequence": None}, usage=final)
        return out + self._event("message_stop")


def anthropic_body(mid: str, model: str, text: str, reasoning: str, calls: Sequence[Call], finish: str,
                   usage: Tokens | None) -> dict[str, Any]:
    """A whole Messages reply (``POST /v1/messages`` without ``stream``)."""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": "scripted-signature"})
    if text:
        content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": orjson.loads(c.arguments or "{}")}
                for c in calls]
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": _ANTHROPIC_STOP.get(finish, finish), "stop_sequence": None,
            "usage": (usage or Tokens(0, 0)).anthropic()}


def error_body(dialect: Dialect, status: int, message: str) -> dict[str, Any]:
    """An error body in the dialect's shape."""
    if dialect == "anthropic":
        kind = {429: "rate_limit_error", 400: "invalid_request_error", 404: "not_found_error",
                529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = "rate_limit_exceeded" if status == 429 else "server_error"
    return {"error": {"message": message, "type": kind, "code": None}}


def forced_tool(body: Any) -> str | None:
    """The tool an Anthropic request forces (``tool_choice`` ``{"type": "tool", "name": ...}``): a structured-output
    request, answered with that tool's input."""
    choice = body.get("tool_choice") if isinstance(body, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "tool" and isinstance(choice.get("name"), str):
        return str(choice["name"])
    return None


def messages_of(dialect: Dialect, body: Any) -> list[dict[str, Any]]:
    """A request's messages as ``[{"role", "content"}]`` whatever the dialect (system text included)."""
    if not isinstance(body, dict):
        return []
    found: list[dict[str, Any]] = []
    system = body.get("instructions") if dialect == "responses" else body.get("system") \
        if dialect == "anthropic" else None
    if isinstance(system, str) and system:
        found.append({"role": "system", "content": system})
    given = body.get("input") if dialect == "responses" else body.get("messages")
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    message: Any
    for message in given if isinstance(given, list) else ():
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, list):  # content parts: their text
                content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            found.append({**message, "content": content})
    return found
