"""Test infrastructure shipped with planweave: a scripted model server (Chat Completions, the Responses API and
Anthropic Messages) for client tests and benchmarks."""

from planweave.testing.scripted_dialects import Call, Tokens
from planweave.testing.scripted_llm import (
    Congestion,
    Drop,
    HttpError,
    RecordedRequest,
    Reply,
    ScriptedLLM,
    ServedCall,
    Stall,
    StreamError,
    Text,
    plan_lines,
    reply_from_json,
)

__all__ = [
    "Call",
    "Congestion",
    "Drop",
    "HttpError",
    "RecordedRequest",
    "Reply",
    "ScriptedLLM",
    "ServedCall",
    "Stall",
    "StreamError",
    "Text",
    "Tokens",
    "plan_lines",
    "reply_from_json",
]
