"""A :class:`~planweave.models.ModelClient` for the OpenAI Responses API (``POST {base_url}/responses``).

The model names ``openai-responses:gpt-...`` (:mod:`planweave.models.dialects`). The transport — retries with
``Retry-After``, admission, timeouts, usage of cut streams — is :class:`~planweave.models.openai.OpenAIChatClient`'s;
this file is the wire format: messages as ``input`` items (system ones as ``instructions``), ``max_output_tokens``,
structured output as ``text.format`` ``json_schema``, function tools (``tool_choice``), and the replies'
``output`` items: ``message`` text, ``function_call`` items (streamed as ``response.function_call_arguments.delta``),
``reasoning`` items (their summaries become :attr:`Completion.reasoning`). Usage: ``input_tokens`` (with
``input_tokens_details.cached_tokens``), ``output_tokens`` (with ``output_tokens_details.reasoning_tokens``), from
``response.completed`` when streaming. Stop sequences and logprobs are not sent (the API has no ``stop``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from planweave.models.base import CompletionRequest, Message, StructuredMode, ToolCall
from planweave.models.dialects import Dialect, wire_name
from planweave.models.openai import OpenAIChatClient, Reply, ServerCompat, _StreamState, _text

_TERMINAL = {"response.completed", "response.incomplete"}


class OpenAIResponsesClient(OpenAIChatClient):
    """A client for one OpenAI Responses endpoint; options as :class:`~planweave.models.openai.OpenAIChatClient`."""

    dialect: Dialect = "responses"
    path = "/responses"
    reply_kind = "Responses API response"

    def _payload(self, request: CompletionRequest, model: str, *,
                 stream: bool) -> tuple[dict[str, Any], StructuredMode | None, ServerCompat]:
        body: dict[str, Any] = {"model": wire_name(model), "store": False}
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        if system:
            body["instructions"] = system
        body["input"] = [item for m in request.messages if m.role != "system" for item in _input_items(m)]
        mode: StructuredMode | None = None
        if request.schema is not None:
            mode = "json_schema"
            body["text"] = {"format": {"type": "json_schema", "name": request.schema_name,
                                       "schema": dict(request.schema)}}
        if request.tools:
            body["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                              "parameters": dict(t.parameters)} for t in request.tools]
            body["tool_choice"] = (request.tool_choice if request.tool_choice in ("auto", "required", "none")
                                   else {"type": "function", "name": request.tool_choice})
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if stream:
            body["stream"] = True
        return body, mode, self.compat

    def _adapt(self, status: int, body: str, request: CompletionRequest, sent: ServerCompat, *,
               stream: bool) -> bool:
        return False  # one wire format: nothing to step down to

    def _reply(self, data: Any, request: CompletionRequest) -> Reply:
        if data.get("object") != "response" or not isinstance(data.get("output"), list):
            raise TypeError("not a response")
        text, calls, reasoning = _output(data["output"])
        return Reply(text, data.get("model"), chat_usage(data.get("usage")), _finish(data, calls), (), calls,
                     reasoning)

    def _event_text(self, line: bytes, state: _StreamState) -> str:
        if state.done or not line.startswith(b"data:"):
            return ""  # the ``event:`` lines repeat the data's ``type``
        data = line[5:].strip()
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise self._bad_reply(state.requested, "stream event is not JSON", body=_text(data)) from None
        if not isinstance(event, dict):
            raise self._bad_reply(state.requested, "stream event is not an object", body=_text(data))
        kind = event.get("type")
        if kind == "response.output_text.delta":
            piece = str(event.get("delta") or "")
            if piece:
                state.pieces.append(piece)
                state.chars += len(piece)
                state.text_events += 1
            return piece
        if kind == "response.output_item.added" and isinstance(event.get("item"), dict):
            item = event["item"]
            if item.get("type") == "function_call":
                state.tool_piece(int(event.get("output_index") or 0), str(item.get("call_id") or item.get("id")),
                                 str(item.get("name") or ""), str(item.get("arguments") or ""))
        elif kind == "response.function_call_arguments.delta":
            state.tool_piece(int(event.get("output_index") or 0), None, None, str(event.get("delta") or ""))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            state.reasoning.append(str(event.get("delta") or ""))
        elif kind in ("response.created", "response.in_progress") or kind in _TERMINAL:
            response = event.get("response") or {}
            state.model = response.get("model") or state.model
            if kind in _TERMINAL:
                state.done = True
                state.usage = chat_usage(response.get("usage")) or state.usage
                state.events_at_usage = state.text_events
                state.finish = _finish(response, state.calls())
        elif kind in ("error", "response.failed"):
            raise self._bad_reply(state.requested, "error in stream", body=_text(data))
        return ""


def _output(items: list[Any]) -> tuple[str, tuple[ToolCall, ...], str]:
    """The text, function calls and reasoning summary of a response's ``output`` items."""
    text: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            text += [str(part.get("text") or "") for part in item.get("content") or ()
                     if part.get("type") == "output_text"]
        elif kind == "function_call":
            calls.append(ToolCall(str(item.get("call_id") or item.get("id") or ""), str(item["name"]),
                                  str(item.get("arguments") or "")))
        elif kind == "reasoning":
            reasoning += [str(part.get("text") or "") for part in item.get("summary") or ()]
    return "".join(text), tuple(calls), "\n\n".join(reasoning)


def _finish(response: Mapping[str, Any], calls: tuple[ToolCall, ...]) -> str | None:
    """Chat Completions' ``finish_reason`` for a response's status (``length`` when cut at max_output_tokens)."""
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details") or {}
        return "length" if details.get("reason") == "max_output_tokens" else "content_filter"
    if calls:
        return "tool_calls"
    return "stop" if status == "completed" else status if isinstance(status, str) else None


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses ``usage`` in Chat Completions' shape (what the shared accounting reads), None if absent."""
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    shaped: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if isinstance(cached, int):
        shaped["prompt_tokens_details"] = {"cached_tokens": cached}
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    if isinstance(reasoning, int):
        shaped["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return shaped


def _input_items(m: Message) -> list[dict[str, Any]]:
    """A message as Responses API ``input`` items: an assistant's tool calls as ``function_call`` items, a tool
    result as a ``function_call_output``."""
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]
    items: list[dict[str, Any]] = [{"role": m.role, "content": m.content}] if m.content or not m.tool_calls else []
    items += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
              for c in m.tool_calls]
    return items
