"""Test infrastructure shipped with planweave: a scripted OpenAI-compatible server for client tests and benchmarks."""

from planweave.testing.scripted_llm import (
    Congestion,
    Drop,
    HttpError,
    RecordedRequest,
    Reply,
    ScriptedLLM,
    ServedCall,
    Stall,
    Text,
    plan_lines,
    reply_from_json,
)

__all__ = [
    "Congestion",
    "Drop",
    "HttpError",
    "RecordedRequest",
    "Reply",
    "ScriptedLLM",
    "ServedCall",
    "Stall",
    "Text",
    "plan_lines",
    "reply_from_json",
]
