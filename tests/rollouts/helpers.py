"""The rollout tests' real parts: a scripted OpenAI-compatible server answering ``ok`` and a client on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from planweave.models.openai import OpenAIChatClient
from planweave.rollouts import Batch
from planweave.testing import ScriptedLLM, Text


@asynccontextmanager
async def ok_policy(ttft: float = 0.0, logprobs: tuple[tuple[float, ...], ...] | None = None
                    ) -> AsyncIterator[tuple[ScriptedLLM, OpenAIChatClient]]:
    """A server that answers every call ``ok`` after ``ttft`` seconds, and a client with room for 256 calls."""
    server = ScriptedLLM(default=Text("ok", logprobs=logprobs), ttft=ttft)
    async with server as url, OpenAIChatClient("scripted", base_url=url, api_key="test", concurrency=256) as client:
        yield server, client


def violations(batch: Batch, max_staleness: int) -> list[tuple[int, int, int]]:
    """(episode, turn, version) of every trainable turn older than the bound at the batch's delivery."""
    return [(t.episode, turn.index, turn.version) for t in batch for turn in t.turns
            if turn.trainable and turn.version < batch.version - max_staleness]
