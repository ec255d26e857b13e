"""A planweave server running for real: uvicorn on 127.0.0.1 (a free port) over a SQLite journal in tmp_path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from planweave import Engine, Event, Run, RunResult, open_engine
from planweave.plan.catalog import ToolCatalog
from planweave.server import LiveServer, StreamTiming, create_app

TOKEN = "test-token-0123456789abcdef"


class RunTracker:
    """Keeps the :class:`Run` of every run the engine starts or resumes (the engine forgets finished ones)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.runs: dict[str, Run] = {}
        engine.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.kind in ("run_created", "run_resumed"):
            self.runs[event.run_id] = self.engine.get(event.run_id)


@dataclass
class Live:
    """A running server, its engine and journal URL, and clients for it."""

    server: LiveServer
    engine: Engine
    journal_url: str
    token: str = TOKEN
    tracker: RunTracker | None = None

    def run(self, run_id: str) -> Run:
        """The latest :class:`Run` of ``run_id`` in this server's engine (finished or not)."""
        assert self.tracker is not None
        return self.tracker.runs[run_id]

    async def wait(self, run_id: str) -> RunResult:
        """Wait for ``run_id`` (started or resumed by this server) to end."""
        return await self.run(run_id).wait()

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, token: str | None = TOKEN, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=httpx.Timeout(30.0), **kwargs)

    async def journal_events(self, run_id: str | None = None, after: int = 0) -> list[Event]:
        return await self.engine.journal.read(run_id, after=after)


def chain_plan(n: int, seconds: float = 0.05, prefix: str = "s") -> dict[str, Any]:
    """``n`` sleep steps, each after the previous one."""
    steps: list[dict[str, Any]] = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"{prefix}{i}", "tool": "sleep", "args": {"seconds": seconds}}
        if i:
            step["after"] = [f"{prefix}{i - 1}"]
        steps.append(step)
    return {"steps": steps}


async def sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Parse a ``text/event-stream`` response into ``{"id", "event", "data"}`` dicts (comments skipped)."""
    frame: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in frame:
                frame["data"] = json.loads(frame["data"])
                yield frame
            frame = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data" and "data" in frame:
            frame["data"] += "\n" + value
        else:
            frame[name] = value


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@asynccontextmanager
async def start_live(
    journal_url: str, *, tools: ToolCatalog | None = None, recover: bool = True,
    timing: StreamTiming | None = None, token: str = TOKEN, engine_options: Mapping[str, Any] | None = None,
) -> AsyncIterator[Live]:
    async with open_engine(journal_url, tools=tools, **dict(engine_options or {})) as engine:
        tracker = RunTracker(engine)  # before the app: its recovery may resume runs
        app = create_app(engine, token, recover=recover, timing=timing)
        async with LiveServer(app, "127.0.0.1", 0, log_config=None) as server:
            yield Live(server, engine, journal_url, token, tracker)


@pytest.fixture
async def live(journal_url: str) -> AsyncIterator[Live]:
    async with start_live(journal_url) as running:
        yield running
