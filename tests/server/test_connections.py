"""Connections: idle and half-sent requests are closed after the request timeout, a client that reads nothing is
dropped, the server holds at most its cap of connections (closing the longest-waiting one for a new one), and
accept errors do not flood the log. A real ``planweave serve`` under a low open-files limit, and servers in-process."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from planweave import Event, open_engine
from planweave.server import LiveServer, create_app
from planweave.server.connections import AcceptErrors, ConnectionLimits

from .conftest import TOKEN

REPO = Path(__file__).resolve().parents[2]
HALF_SENT = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"  # the headers never end


async def connect(url: str, first: bytes = b"", rcvbuf: int | None = None) -> socket.socket:
    parsed = httpx.URL(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (parsed.host, parsed.port))
    if first:
        await loop.sock_sendall(sock, first)
    return sock


async def closed_by_server(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (end of file or reset); what it sent meanwhile."""
    loop = asyncio.get_running_loop()
    received = b""
    while True:
        try:
            chunk = await loop.sock_recv(sock, 65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


class Noticed(logging.Handler):
    """Sets ``event`` when a log record containing ``text`` is emitted (the server saying what it did)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@asynccontextmanager
async def server(limits: ConnectionLimits, journal: str = "memory://") -> AsyncIterator[LiveServer]:
    async with open_engine(journal) as engine:
        app = create_app(engine, TOKEN, recover=False)
        async with LiveServer(app, "127.0.0.1", 0, log_config=None, connections=limits) as live:
            yield live


async def healthz(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return (await client.get("/healthz")).status_code


async def test_idle_and_half_sent_connections_are_closed_after_the_request_timeout() -> None:
    async with server(ConnectionLimits(request_timeout=0.3)) as live:
        idle = await connect(live.url)
        half = await connect(live.url, HALF_SENT)
        try:
            async with asyncio.timeout(20):  # a cap against a hang, not a margin: the timeout is 0.3 s
                assert await closed_by_server(idle) == b""
                assert await closed_by_server(half) == b""
        finally:
            idle.close()
            half.close()
        assert await healthz(live.url) == 200


async def test_a_kept_alive_connection_that_starts_a_request_and_stalls_is_closed_too() -> None:
    async with server(ConnectionLimits(request_timeout=0.3)) as live:
        sock = await connect(live.url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(20):
                answer = b""
                while b'"status":"ok"' not in answer:
                    answer += await loop.sock_recv(sock, 65536)
                await loop.sock_sendall(sock, HALF_SENT)  # the second request never ends
                assert await closed_by_server(sock) == b""
        finally:
            sock.close()


async def test_at_the_cap_a_new_connection_closes_the_longest_waiting_one() -> None:
    async with server(ConnectionLimits(request_timeout=600, max_connections=4)) as live:
        waiting = [await connect(live.url, HALF_SENT) for _ in range(4)]
        try:
            assert await healthz(live.url) == 200  # got in: the oldest waiting connection made room
            async with asyncio.timeout(20):
                assert await closed_by_server(waiting[0]) == b""
        finally:
            for sock in waiting:
                sock.close()


async def test_a_client_that_reads_nothing_is_dropped_after_the_stall_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    journal = f"sqlite:///{tmp_path / 'runs.db'}"
    async with open_engine(journal) as engine:  # ~6 MB of events: more than the socket buffers hold
        for i in range(3000):
            engine.journal.append(Event("bulk", "step_started", 1.0 + i, f"s{i}", {"pad": "x" * 2000}))
        await engine.journal.flush()
    async with server(ConnectionLimits(stall_timeout=0.5), journal) as live:
        sock = await connect(live.url, f"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                                       "\r\n".encode(), rcvbuf=4096)
        dropped = Noticed("read nothing for")
        logging.getLogger("planweave.server").addHandler(dropped)
        caplog.set_level(logging.INFO, logger="planweave.server")
        try:
            async with asyncio.timeout(30):  # a cap against a hang: the stall timeout is 0.5 s
                await dropped.event.wait()  # the client read nothing meanwhile
                received = await closed_by_server(sock)
        finally:
            logging.getLogger("planweave.server").removeHandler(dropped)
            sock.close()
        assert len(received) < 6_000_000  # it was cut off, not sent everything
        assert live.open_connections == 0
        assert await healthz(live.url) == 200


def test_accept_errors_are_logged_once_an_interval_with_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttle = AcceptErrors(interval=10.0, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        error = OSError(24, "Too many open files")
        with caplog.at_level(logging.ERROR, logger="planweave.server"):
            for _ in range(2048):  # one tick of asyncio's accept loop with a full backlog
                throttle(loop, {"message": AcceptErrors.MESSAGE, "exception": error})
            now[0] = 10.5
            throttle(loop, {"message": AcceptErrors.MESSAGE, "exception": error})
    finally:
        loop.close()
    records = [r.getMessage() for r in caplog.records if r.name == "planweave.server"]
    assert len(records) == 2
    assert "Too many open files" in records[0] and "0 more" in records[0]
    assert "2047 more" in records[1]


def _low_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


@pytest.mark.parametrize("cap", [[], ["--config", "max_connections=5000"]],
                         ids=["default-cap", "cap-above-the-fd-limit"])
async def test_a_real_server_with_few_file_descriptors_survives_many_half_sent_requests(
    tmp_path: Path, cap: list[str],
) -> None:
    # With a cap above what the process may open, accept() itself fails for a while: logged once, not per attempt.
    log = tmp_path / "serve.log"
    env = {**{k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}, "PLANWEAVE_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal",
            f"sqlite:///{tmp_path / 'runs.db'}", "--config", "request_timeout=1", *cap, cwd=REPO, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, preexec_fn=_low_fd_limit)
    sockets: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        found = re.search(r"serving (http://\S+)", first)
        assert found is not None, first
        url = found.group(1)
        for _ in range(400):  # more connections than the server has file descriptors
            sockets.append(await connect(url, HALF_SENT))
        assert await healthz(url) == 200
        async with asyncio.timeout(60):  # each is closed: by the request timeout, or for a newer connection
            answers = await asyncio.gather(*(closed_by_server(s) for s in sockets))
        assert {a for a in answers if a} <= {a for a in answers if a.startswith(b"HTTP/1.1 503")}
        assert await healthz(url) == 200
    finally:
        for sock in sockets:
            sock.close()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
    size = log.stat().st_size
    assert size < 20_000, f"{size} bytes of log: {log.read_text()[:2000]}"
