"""Serving an app with uvicorn inside the running event loop, so that the server and the engine share it.

:class:`LiveServer` binds its socket itself (port 0 picks a free one), waits for the app's startup, ends the
event streams before uvicorn waits for connections to close (they would hold a shutdown forever), handles
SIGINT/SIGTERM through the loop only when asked (the CLI has its own handlers otherwise) and never re-raises them,
keeps the access token out of uvicorn's log records, and bounds its connections (:mod:`planweave.server.connections`:
request and stall timeouts, a connection cap, accept errors logged once in a while).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any, Protocol
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI

from planweave.core.errors import PlanweaveError
from planweave.server.connections import AcceptErrors, ConnectionLimits, GuardedConfig
from planweave.server.tokens import AccessToken

__all__ = ["LiveServer", "ServerError"]

log = logging.getLogger("planweave.server")


class ServerError(PlanweaveError):
    """The server could not start: the address is taken, or the app is not a planweave app."""


class _Feed(Protocol):
    def close(self) -> None: ...


class _ServedState(Protocol):
    """What :class:`LiveServer` needs of ``app.state.planweave`` (the app's :class:`~planweave.server.app.AppState`)."""

    token: AccessToken
    ready: asyncio.Event
    recovered: list[str]

    @property
    def feed(self) -> _Feed: ...


class _Uvicorn(uvicorn.Server):
    """uvicorn, told to end the event streams before it waits for open connections to close."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None], handle_signals: bool) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Through the loop, and never re-raised afterwards (uvicorn's default): the engine and journal must close
        # cleanly after the server stops, which a re-raised SIGINT would interrupt.
        if not self._handle_signals:
            yield
            return
        import signal

        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                continue
            installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()  # endless event streams would otherwise hold the shutdown forever
        await super().shutdown(sockets)


class _RedactToken(logging.Filter):
    """Replaces the token in uvicorn's log records, in case a client put it in a URL."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(self._token in str(a) for a in record.args):
            record.args = tuple(str(a).replace(self._token, "[token]") if self._token in str(a) else a
                                for a in record.args)
        if isinstance(record.msg, str) and self._token in record.msg:
            record.msg = record.msg.replace(self._token, "[token]")
        return True


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        hint = " (is another `planweave serve` running? choose another --port)" if port else ""
        raise ServerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.setblocking(False)
    return sock


class LiveServer:
    """The app served by uvicorn in this event loop until :meth:`stop` (or SIGINT/SIGTERM if it handles them).

    Use as ``async with LiveServer(app) as server``: on entry the socket is bound (port 0 picks a free one; a taken
    port raises :class:`ServerError`) and the app has started (interrupted runs resumed), so :attr:`url` works.
    ``log_config`` None leaves logging alone (uvicorn's records propagate to the root logger). ``connections``
    bounds how long clients may take and how many connections are held (default :class:`ConnectionLimits`).
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 8765,
        *,
        handle_signals: bool = False,
        log_config: dict[str, Any] | None = uvicorn.config.LOGGING_CONFIG,
        access_log: bool = True,
        connections: ConnectionLimits | None = None,
    ) -> None:
        state: _ServedState | None = getattr(app.state, "planweave", None)
        if state is None:
            raise ServerError("LiveServer serves apps made by planweave.server.create_app")
        self.app = app
        self.host = host
        self.port = port
        self._state = state
        self._handle_signals = handle_signals
        self._log_config = log_config
        self._access_log = access_log
        self._connections = connections or ConnectionLimits()
        self._accept_errors = AcceptErrors()
        self._sock: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self._redact = _RedactToken(state.token.value)

    @property
    def url(self) -> str:
        """The base URL, ending with ``/`` (the dashboard)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def dashboard_url(self, run_id: str | None = None) -> str:
        """The dashboard's URL, opened on ``run_id`` if given."""
        return self.url + (f"#/runs/{quote(run_id)}" if run_id else "")

    @property
    def open_connections(self) -> int:
        """How many client connections the server holds now."""
        if self._server is None or not isinstance(self._server.config, GuardedConfig):
            return 0
        return self._server.config.registry.open

    @property
    def recovered(self) -> list[str]:
        """The runs that startup resumed (interrupted when a previous server stopped)."""
        return list(self._state.recovered)

    async def __aenter__(self) -> LiveServer:
        self._sock = _bind(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        config = GuardedConfig(self.app, self._connections, log_config=self._log_config, access_log=self._access_log,
                               lifespan="on", ws="none", timeout_graceful_shutdown=5, proxy_headers=False,
                               server_header=False)
        self._server = _Uvicorn(config, self._state.feed.close, self._handle_signals)
        for name in ("uvicorn.access", "uvicorn.error"):
            logging.getLogger(name).addFilter(self._redact)
        self._accept_errors.install(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="planweave-server")
        ready = asyncio.create_task(self._state.ready.wait())
        await asyncio.wait([self._task, ready], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            await self._finish()
            raise ServerError(f"the server at {self.url} stopped while starting (see its log)")
        return self

    def stop(self) -> None:
        """Ask the server to stop: event streams end, open requests get a few seconds to complete."""
        if self._server is not None:
            self._server.should_exit = True

    async def wait(self) -> None:
        """Return when the server has stopped (after :meth:`stop`, or a signal when it handles them)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _finish(self) -> None:
        try:
            if self._task is not None:
                await asyncio.wait([self._task])
                if not self._task.cancelled() and self._task.exception() is not None:
                    log.error("the server stopped with an error: %s", self._task.exception())
        finally:
            if self._sock is not None:
                self._sock.close()
            for name in ("uvicorn.access", "uvicorn.error"):
                logging.getLogger(name).removeFilter(self._redact)
            self._accept_errors.uninstall()

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()
        await self._finish()
