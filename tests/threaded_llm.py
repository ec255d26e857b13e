"""The scripted server on its own loop in a thread: for child processes, or for the in-process CLI (which runs its
own loop), to call."""

from __future__ import annotations

import asyncio
import threading

from planweave.testing.scripted_llm import ScriptedLLM


class ThreadedLLM:
    """``with ThreadedLLM(ScriptedLLM(...)) as server:``: ``server.llm`` at ``server.url`` until the block ends."""

    def __init__(self, llm: ScriptedLLM) -> None:
        self.url = ""
        self.llm = llm
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.llm as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedLLM:
        self._thread.start()
        assert self._ready.wait(30), "the scripted server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
