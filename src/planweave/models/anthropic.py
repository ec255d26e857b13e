"""A :class:`~planweave.models.ModelClient` for Anthropic Messages (``POST {base_url}/messages``).

The model names ``anthropic:claude-...`` (:mod:`planweave.models.dialects`); the base URL ends with ``/v1``
(default ``https://api.anthropic.com/v1``; ``$ANTHROPIC_BASE_URL``, the SDK's variable, gets ``/v1`` added when it
lacks it), the key goes in ``x-api-key`` (default ``$ANTHROPIC_API_KEY``). The transport — retries with
``Retry-After``, admission, timeouts, usage of cut streams — is :class:`~planweave.models.openai.OpenAIChatClient`'s;
this file is the wire format: system messages as ``system``, ``max_tokens`` always sent (the API requires it:
:data:`~planweave.models.pricing.DEFAULT_MAX_TOKENS` when the request has none), ``stop_sequences``, tools with
``input_schema`` and ``tool_choice``, and structured output by **tool forcing** (a tool named after the schema whose
input is the reply, streamed as ``input_json_delta`` text). Streams are ``message_start`` (usage of the input and
the cache), ``content_block_start/delta/stop`` (``text_delta``, ``input_json_delta``, ``thinking_delta``),
``message_delta`` (the output tokens so far, the stop reason) and ``message_stop``. Usage: ``input_tokens`` does not
count the cache, so the prompt is ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, the cache
reads and writes priced at their own rates. Stop reasons are given in Chat Completions' words (``end_turn`` →
``stop``, ``max_tokens`` → ``length``, ``tool_use`` → ``tool_calls``). Logprobs are not available.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from planweave.models.base import CompletionRequest, Message, StructuredMode, ToolCall
from planweave.models.dialects import Dialect, wire_name
from planweave.models.openai import OpenAIChatClient, Reply, ServerCompat, _StreamState, _text
from planweave.models.pricing import DEFAULT_MAX_TOKENS

API_VERSION = "2023-06-01"
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                "refusal": "content_filter", "pause_turn": "pause_turn"}


class AnthropicClient(OpenAIChatClient):
    """A client for one Anthropic Messages endpoint; options as :class:`~planweave.models.openai.OpenAIChatClient`."""

    dialect: Dialect = "anthropic"
    path = "/messages"
    default_base_url = "https://api.anthropic.com/v1"
    base_url_env = "ANTHROPIC_BASE_URL"
    key_env = "ANTHROPIC_API_KEY"
    reply_kind = "Messages API message"

    @classmethod
    def _env_base_url(cls) -> str | None:
        url = os.environ.get(cls.base_url_env)
        if not url:
            return None
        url = url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"  # the SDK's variable has no /v1

    def _auth_headers(self, key: str | None) -> dict[str, str]:
        return {"anthropic-version": API_VERSION, **({"x-api-key": key} if key else {})}

    def _payload(self, request: CompletionRequest, model: str, *,
                 stream: bool) -> tuple[dict[str, Any], StructuredMode | None, ServerCompat]:
        body: dict[str, Any] = {"model": wire_name(model),
                                "max_tokens": request.max_tokens if request.max_tokens is not None
                                else DEFAULT_MAX_TOKENS}
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        if system:
            body["system"] = system
        body["messages"] = _messages(request.messages)
        tools = [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                 for t in request.tools]
        mode: StructuredMode | None = None
        if request.schema is not None:  # tool forcing: the forced tool's input is the reply
            mode = "tool"
            tools.append({"name": request.schema_name, "description": "Give the answer in this structure.",
                          "input_schema": dict(request.schema)})
            body["tool_choice"] = {"type": "tool", "name": request.schema_name}
        elif request.tools:
            choice = request.tool_choice
            body["tool_choice"] = ({"type": "auto"} if choice == "auto" else {"type": "any"} if choice == "required"
                                   else {"type": "none"} if choice == "none" else {"type": "tool", "name": choice})
        if tools:
            body["tools"] = tools
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        if stream:
            body["stream"] = True
        return body, mode, self.compat

    def _adapt(self, status: int, body: str, request: CompletionRequest, sent: ServerCompat, *,
               stream: bool) -> bool:
        return False

    def _reply(self, data: Any, request: CompletionRequest) -> Reply:
        if data.get("type") != "message" or not isinstance(data.get("content"), list):
            raise TypeError("not a message")
        text: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[str] = []
        for block in data["content"]:
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text") or ""))
            elif kind == "tool_use":
                calls.append(ToolCall(str(block.get("id") or ""), str(block["name"]),
                                      orjson.dumps(block.get("input") or {}).decode()))
            elif kind == "thinking":
                thinking.append(str(block.get("thinking") or ""))
        finish = _stop(data.get("stop_reason"))
        if request.schema is not None:  # tool forcing: the forced tool's input is the reply's text
            forced = [c for c in calls if c.name == request.schema_name]
            calls = [c for c in calls if c.name != request.schema_name]
            text = [forced[0].arguments] if forced and not "".join(text) else text
            finish = "stop" if finish == "tool_calls" and not calls else finish
        return Reply("".join(text), data.get("model"), chat_usage(data.get("usage")), finish, (), tuple(calls),
                     "\n\n".join(thinking))

    def _event_text(self, line: bytes, state: _StreamState) -> str:
        if state.done or not line.startswith(b"data:"):
            return ""  # ``event:`` lines repeat the data's ``type``
        data = line[5:].strip()
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise self._bad_reply(state.requested, "stream event is not JSON", body=_text(data)) from None
        if not isinstance(event, dict):
            raise self._bad_reply(state.requested, "stream event is not an object", body=_text(data))
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._block_delta(event, state)
        if kind == "content_block_start":
            return self._block_start(event, state)
        if kind in ("message_start", "message_delta"):
            if kind == "message_start":
                message = event.get("message") or {}
                state.model = message.get("model") or state.model
                given = message.get("usage")
            else:
                state.finish = _stop((event.get("delta") or {}).get("stop_reason")) or state.finish
                given = event.get("usage")
            # message_delta's usage is cumulative; older servers send only output_tokens there
            state.raw_usage = {**(state.raw_usage or {}), **(given if isinstance(given, dict) else {})}
            state.usage = chat_usage(state.raw_usage) or state.usage
            state.events_at_usage = state.text_events
        elif kind == "message_stop":
            state.done = True
            if state.forced is not None:  # the forced tool's input was the text: not a tool call
                state.tools = {i: t for i, t in state.tools.items() if t[1] != state.forced}
                if state.finish == "tool_calls" and not state.tools:
                    state.finish = "stop"
        elif kind == "error":
            raise self._bad_reply(state.requested, "error in stream", body=_text(data))
        return ""

    def _block_delta(self, event: Mapping[str, Any], state: _StreamState) -> str:
        delta = event.get("delta") or {}
        index = int(event.get("index") or 0)
        if delta.get("type") == "text_delta":
            return self._text_piece(state, str(delta.get("text") or ""))
        if delta.get("type") == "input_json_delta":
            piece = str(delta.get("partial_json") or "")
            if state.forced is not None and state.tools.get(index, ["", ""])[1] == state.forced:
                return self._text_piece(state, piece)  # structured output by tool forcing: the reply's text
            state.tool_piece(index, None, None, piece)
        elif delta.get("type") == "thinking_delta":
            state.reasoning.append(str(delta.get("thinking") or ""))
        return ""

    def _block_start(self, event: Mapping[str, Any], state: _StreamState) -> str:
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            index = int(event.get("index") or 0)
            if block.get("name") == state.forced:
                state.tools[index] = [str(block.get("id") or ""), str(block["name"]), ""]
            else:
                state.tool_piece(index, str(block.get("id") or ""), str(block.get("name") or ""), "")
        elif block.get("type") == "text" and block.get("text"):
            return self._text_piece(state, str(block["text"]))
        return ""

    @staticmethod
    def _text_piece(state: _StreamState, piece: str) -> str:
        if piece:
            state.pieces.append(piece)
            state.chars += len(piece)
            state.text_events += 1
        return piece

    def _new_state(self, request: CompletionRequest, model: str) -> _StreamState:
        state = super()._new_state(request, model)
        state.forced = request.schema_name if request.schema is not None else None
        return state


def _stop(reason: Any) -> str | None:
    return STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """An Anthropic ``usage`` in Chat Completions' shape: the prompt counts the cache's reads and writes too."""
    if not isinstance(usage, Mapping):
        return None
    fresh, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(fresh, int) or not isinstance(completion, int):
        return None
    read = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    read = read if isinstance(read, int) else 0
    written = written if isinstance(written, int) else 0
    prompt = fresh + read + written
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}, "cache_write_tokens": written}


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The non-system messages as Messages API turns: an assistant's tool calls as ``tool_use`` blocks, tool results
    as ``tool_result`` blocks of one user turn (consecutive results together, as the API wants them)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            last = out[-1] if out else None
            if last is not None and last["role"] == "user" and isinstance(last["content"], list) and all(
                    b.get("type") == "tool_result" for b in last["content"]):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.tool_calls:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": orjson.loads(c.arguments or "{}")}
                       for c in m.tool_calls]
            out.append({"role": m.role, "content": blocks})
        else:
            out.append({"role": m.role, "content": m.content})
    return out
