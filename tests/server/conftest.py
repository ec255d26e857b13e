"""A planweave server running for real: uvicorn on 127.0.0.1 (a free port) over a SQLite journal in tmp_path.

Tests wait for what they need from the server's own engine (:meth:`Live.until`, :meth:`Live.finished`: its events,
with a generous cap), never by polling over HTTP or sleeping "long enough"; a step that must still run when the
server stops is a ``gate`` (:func:`gated_tools`), not a sleep that is hoped to outlast the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from planweave import Engine, Event, Run, RunResult, Toolbox, builtin_tools, open_engine
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.state import RunState
from planweave.server import LiveServer, StreamTiming, create_app
from planweave.server.limits import LimitCaps, open_server_model
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM
from planweave.testing.server import chain_plan, read_sse
from tests.timing import step_is, until

TOKEN = "test-token-0123456789abcdef"
sse = read_sse  # the tests' name for the stream parser
__all__ = ["TOKEN", "Live", "RunTracker", "chain_plan", "gated_tools", "sse", "start_live"]


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

    async def wait(self, run_id: str, cap: float = 30.0) -> RunResult:
        """Wait for ``run_id`` (started or resumed by this server) to end; ``cap`` seconds bound a hang."""
        try:
            return await asyncio.wait_for(self.run(run_id).wait(), cap)
        except TimeoutError:
            raise AssertionError(f"run {run_id} did not end within {cap:g} s") from None

    async def until(self, run_id: str, condition: Callable[[RunState], bool], what: str, cap: float = 30.0) -> None:
        """Return once ``condition`` holds for ``run_id``'s state in this server's engine (see :func:`until`)."""
        await until(self.run(run_id), condition, what, cap)

    async def until_step(self, run_id: str, step: str, status: str) -> None:
        """Return once step ``step`` of ``run_id`` has ``status`` here."""
        await self.until(run_id, step_is(step, status), f"step {step!r} becoming {status}")

    async def finished(self, client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
        """Wait for ``run_id`` to end here, then return ``GET /runs/{run_id}`` as the client sees it."""
        await self.wait(run_id)
        response = await client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, token: str | None = TOKEN, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        # An idle connection is not reused after 2 s: uvicorn closes idle keep-alive connections after 5 s, and a
        # request sent on one as it closes fails with ReadError (a test that waited ~5 s for a run's deadline, then
        # asked for the run, failed so about 1 run in 5).
        kwargs.setdefault("limits", httpx.Limits(keepalive_expiry=2.0))
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=httpx.Timeout(30.0), **kwargs)

    async def journal_events(self, run_id: str | None = None, after: int = 0) -> list[Event]:
        return await self.engine.journal.read(run_id, after=after)


def gated_tools(gate: asyncio.Event | None) -> Toolbox:
    """The built-in tools and ``gate`` (idempotent): it returns ``{"passed": True}`` once ``gate`` is set, at once if
    ``gate`` is None. A server stopped while a run waits at a closed gate interrupts it there; the next server, given
    an open gate, resumes it."""
    box = builtin_tools()

    async def gate_tool() -> dict[str, bool]:
        """Wait until the test opens the gate."""
        if gate is not None:
            await gate.wait()
        return {"passed": True}

    box.add(gate_tool, name="gate", idempotent=True)
    return box


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@asynccontextmanager
async def start_live(
    journal_url: str, *, tools: ToolCatalog | None = None, recover: bool = True,
    timing: StreamTiming | None = None, token: str = TOKEN, engine_options: Mapping[str, Any] | None = None,
    model: Callable[[RecordedRequest], Reply] | None = None, caps: LimitCaps | None = None,
) -> AsyncIterator[Live]:
    """Serve an engine over ``journal_url`` until the block ends.

    ``model``: the server plans goals and binds ``llm`` steps with the model ``scripted``, a :class:`ScriptedLLM`
    answering with this script; ``caps``: the server's limits (``planweave serve --max-*``).
    """
    async with contextlib.AsyncExitStack() as stack:
        # The model server outlives the engine: a run interrupted at shutdown is not failed by a vanished model.
        base_url = await stack.enter_async_context(ScriptedLLM(model)) if model is not None else None
        engine = await stack.enter_async_context(open_engine(journal_url, tools=tools, **dict(engine_options or {})))
        tracker = RunTracker(engine)  # before the app: its recovery may resume runs
        server_model = await open_server_model(stack, engine, "scripted", base_url) if base_url else None
        app = create_app(engine, token, recover=recover, timing=timing, model=server_model, caps=caps)
        server = await stack.enter_async_context(LiveServer(app, "127.0.0.1", 0, log_config=None))
        yield Live(server, engine, journal_url, token, tracker)


@pytest.fixture
async def live(journal_url: str) -> AsyncIterator[Live]:
    async with start_live(journal_url) as running:
        yield running
