"""The ``http.*`` tools of a toolbox share one pooled client: connections are reused, bounded, and closed with the
engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from planweave import RunResult, builtin_tools, open_engine


class CountingServer(ThreadingHTTPServer):
    """An HTTP/1.1 keep-alive server on 127.0.0.1 that counts the TCP connections it accepts and sees closed."""

    daemon_threads = True

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.delay = delay
        self.lock = threading.Lock()
        self.opened = 0
        self.open_now = 0
        self.peak = 0
        self.all_closed = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def connected(self, change: int) -> None:
        with self.lock:
            self.opened += max(change, 0)
            self.open_now += change
            self.peak = max(self.peak, self.open_now)
            if self.open_now == 0:
                self.all_closed.set()
            else:
                self.all_closed.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingServer

    def setup(self) -> None:
        super().setup()
        self.server.connected(+1)

    def finish(self) -> None:
        super().finish()
        self.server.connected(-1)

    def do_GET(self) -> None:
        if self.server.delay:
            time.sleep(self.server.delay)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[CountingServer]:
    srv = CountingServer(delay=getattr(request, "param", 0.0))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


async def fan_out(url: str, n: int, concurrency: int | None, **toolbox: Any) -> RunResult:
    async with open_engine("memory://", concurrency=concurrency, tools=builtin_tools(**toolbox)) as engine:
        run = await engine.start({"on_failure": "continue", "steps": [
            {"id": f"get{i}", "tool": "http.get", "args": {"url": url}} for i in range(n)]})
        return await run.wait()


async def test_http_steps_reuse_the_connections_of_one_pool(server: CountingServer) -> None:
    result = await fan_out(server.url, 40, concurrency=4)
    assert result.status == "succeeded"
    assert result.outputs["get7"]["json"] == {"ok": True}
    assert server.opened <= 4  # a client per call would open 40


@pytest.mark.parametrize("server", [0.05], indirect=True)
async def test_the_pool_bounds_open_connections_whatever_the_concurrency(server: CountingServer) -> None:
    result = await fan_out(server.url, 30, concurrency=None, http_max_connections=3)
    assert result.status == "succeeded"
    assert server.peak <= 3


async def test_the_engine_closes_the_pool_when_it_closes(server: CountingServer) -> None:
    result = await fan_out(server.url, 5, concurrency=2)
    assert result.status == "succeeded" and server.opened >= 1
    assert server.all_closed.wait(10), f"{server.open_now} connection(s) still open after the engine closed"


def test_max_connections_must_be_positive() -> None:
    with pytest.raises(ValueError, match="http_max_connections must be at least 1"):
        builtin_tools(http_max_connections=0)
