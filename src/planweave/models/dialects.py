"""Which wire protocol a ``--model`` name speaks: a dialect prefix, else OpenAI Chat Completions.

``anthropic:claude-sonnet-4-5`` is Anthropic Messages, ``openai-responses:gpt-5-mini`` the OpenAI Responses API,
``openai:gpt-4o-mini`` (or a bare ``gpt-4o-mini``, as before) Chat Completions. Only these prefixes are dialects:
any other colon stays part of the name (Ollama's ``llama3.1:8b`` is a Chat Completions model). The name sent to the
endpoint is the part after the prefix; the price is looked up under it. A leaf module: no HTTP import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from planweave.models.openai import OpenAIChatClient

Dialect = Literal["chat", "responses", "anthropic"]

#: Prefix → dialect. ``openai:`` is the default spelled out.
PREFIXES: dict[str, Dialect] = {"openai": "chat", "openai-responses": "responses", "anthropic": "anthropic"}
#: Each dialect's client: module and class (imported when first used: this module imports no HTTP library).
CLIENTS: dict[Dialect, tuple[str, str]] = {
    "chat": ("planweave.models.openai", "OpenAIChatClient"),
    "responses": ("planweave.models.openai_responses", "OpenAIResponsesClient"),
    "anthropic": ("planweave.models.anthropic", "AnthropicClient"),
}
#: The genai-prices provider of each dialect's hosted API (a hint for names the database would not place).
PROVIDERS: dict[Dialect, str] = {"chat": "openai", "responses": "openai", "anthropic": "anthropic"}


def split_model(name: str) -> tuple[Dialect, str]:
    """``(dialect, name sent to the endpoint)`` of a model name: ``anthropic:claude-x`` → ``("anthropic",
    "claude-x")``; a name without a dialect prefix is Chat Completions, unchanged."""
    prefix, sep, rest = name.partition(":")
    if sep and rest and prefix in PREFIXES:
        return PREFIXES[prefix], rest
    return "chat", name


def wire_name(name: str) -> str:
    """The model name sent to the endpoint: ``name`` without its dialect prefix."""
    return split_model(name)[1]


def dialect_of(name: str) -> Dialect:
    """The dialect a model name speaks (see :func:`split_model`)."""
    return split_model(name)[0]


def client_class(name: str) -> type[OpenAIChatClient]:
    """The client class of a model name's dialect (:func:`split_model`), imported on first use."""
    module, attribute = CLIENTS[dialect_of(name)]
    found: type[OpenAIChatClient] = getattr(importlib.import_module(module), attribute)
    return found
