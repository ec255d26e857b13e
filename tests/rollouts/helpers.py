"""The rollout tests' real parts: a scripted OpenAI-compatible server answering ``ok`` and a client on it; one in a
thread for rollout processes."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from planweave.models.openai import OpenAIChatClient
from planweave.rollouts import Batch
from planweave.testing import ScriptedLLM, Text
from planweave.testing.scripted_llm import RecordedRequest


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


class CountingServer:
    """A scripted server answering every call ``reply`` in a thread of its own, for rollout processes the test
    starts; :meth:`wait_for` returns once it has served ``n`` calls in all (how a test picks the moment to kill)."""

    def __init__(self, reply: str = "ok", ttft: float = 0.005) -> None:
        self.reply, self.ttft = reply, ttft
        self.calls = 0
        self.prompts: list[str] = []
        self._served = threading.Condition()

    def _answer(self, request: RecordedRequest) -> Text:
        with self._served:
            self.calls += 1
            self.prompts.append(json.dumps(request.body))
            self._served.notify_all()
        return Text(self.reply)

    def wait_for(self, n: int, timeout: float = 60) -> bool:
        with self._served:
            return self._served.wait_for(lambda: self.calls >= n, timeout)

    @contextmanager
    def serving(self) -> Iterator[str]:
        """The server's base URL while the block runs."""
        ready: list[str] = []
        started = threading.Event()
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()

        async def serve() -> None:
            async with ScriptedLLM(self._answer, ttft=self.ttft) as url:
                ready.append(url)
                started.set()
                await stop.wait()

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()
        assert started.wait(10), "the scripted server did not start"
        try:
            yield ready[0]
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
            loop.close()
