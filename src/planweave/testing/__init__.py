"""Test infrastructure shipped with planweave: a scripted OpenAI-compatible server for client tests and benchmarks."""

from planweave.testing.scripted_llm import (
    Drop,
    HttpError,
    RecordedRequest,
    Reply,
    ScriptedLLM,
    Stall,
    Text,
    plan_lines,
    reply_from_json,
)

__all__ = [
    "Drop",
    "HttpError",
    "RecordedRequest",
    "Reply",
    "ScriptedLLM",
    "Stall",
    "Text",
    "plan_lines",
    "reply_from_json",
]
