"""The connections the server holds: a deadline for every request to arrive, no client kept that stops reading, and
at most ``max_connections`` at once, so idle, half-open or slow sockets cannot take every file descriptor.

uvicorn times out only a kept-alive connection between two requests (``timeout_keep_alive``): a socket that
connects and sends nothing, or half a request's headers, is held forever, and ``limit_concurrency`` answers 503 only
once a request's headers are in, so such sockets still pile up until ``accept()`` fails with "Too many open files"
(and asyncio's accept loop then logs that error once per pending connection, every time it retries). Here uvicorn's
HTTP protocol is extended (:class:`GuardedH11Protocol`, configured by :class:`GuardedConfig`), per server:

- a connection waiting for a request (just opened, or between two requests, or halfway through one) gets
  ``request_timeout`` seconds to send all of it, headers and body, then it is closed;
- a response whose client has read nothing for ``stall_timeout`` seconds while the server has bytes for it (the
  connection's write buffer stays above its high-water mark) is dropped: the socket is aborted and the stream
  behind it ends (a live event stream's client reconnects with ``Last-Event-ID``);
- at ``max_connections`` open connections a new one closes the one that has waited longest for a request, so a
  real request still gets in; if every connection is busy with a request, the new one is answered 503 and closed.

:class:`AcceptErrors` keeps asyncio's accept-loop errors to one log record per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

__all__ = ["AcceptErrors", "ConnectionLimits", "GuardedConfig", "GuardedH11Protocol"]

log = logging.getLogger("planweave.server")

_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: 40\r\nconnection: close\r\n\r\ntoo many connections: try again shortly\n")


def _descriptor_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, to read a response, and how many connections are held at once.

    ``idle_timeout`` (whole seconds, uvicorn's ``timeout_keep_alive``) closes a kept-alive connection that sends no
    next request; ``max_connections`` None is three quarters of this process's file-descriptor limit (the rest is
    for the journal, tools and model clients), or 1,000 where there is no such limit.
    """

    request_timeout: float = 10.0
    stall_timeout: float = 60.0
    idle_timeout: int = 5
    max_connections: int | None = None

    def __post_init__(self) -> None:
        if self.request_timeout <= 0 or self.stall_timeout <= 0 or self.idle_timeout < 1:
            raise ValueError("connection timeouts must be positive (idle_timeout: at least one second)")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")

    def connection_cap(self) -> int:
        """``max_connections``, or the default derived from the file-descriptor limit."""
        if self.max_connections is not None:
            return self.max_connections
        fds = _descriptor_limit()
        return 1000 if fds is None else max(16, fds * 3 // 4)


class _Registry:
    """The open connections of one server, and which of them wait for a request (oldest first)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0
        self.waiting: dict[GuardedH11Protocol, None] = {}  # insertion-ordered: the longest waiting first


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with :class:`ConnectionLimits`: its connections are :class:`GuardedH11Protocol`."""

    def __init__(self, app: Any, limits: ConnectionLimits, **options: Any) -> None:
        super().__init__(app, http=GuardedH11Protocol, timeout_keep_alive=limits.idle_timeout, **options)
        self.limits = limits
        self.registry = _Registry(limits.connection_cap())  # one per server: its connections share it


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol for one connection, with a request deadline, a stall deadline and a place among its
    server's connections (the :class:`GuardedConfig` it is created with)."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, GuardedConfig):
            raise TypeError("GuardedH11Protocol serves a GuardedConfig")
        self.limits = config.limits
        self.registry = config.registry
        self._request_deadline: asyncio.TimerHandle | None = None
        self._stall_deadline: asyncio.TimerHandle | None = None
        self._counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        registry = self.registry
        if registry.open >= registry.cap and not self._evict_one():
            transport.write(_REFUSED)  # every connection is busy with a request: this one cannot be served
            transport.close()
            return
        registry.open += 1
        self._counted = True
        super().connection_made(transport)
        self._await_request()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for a request; whether there was one."""
        for other in self.registry.waiting:
            other.close("closed for a new connection: the server holds its most connections")
            return True
        return False

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._await_request()  # bytes of a request whose headers are not all in yet
        elif not cycle.more_body:
            self._request_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle.response_complete:
            # Kept alive: uvicorn's idle timer runs until the next request starts to arrive, then ours does.
            self.registry.waiting[self] = None
        elif cycle.more_body:
            self._await_request()  # a pipelined request, not all in yet
        else:
            self._request_arrived()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_deadline is None:
            self._stall_deadline = self.loop.call_later(self.limits.stall_timeout, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_deadline is not None:
            self._stall_deadline.cancel()
            self._stall_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self.registry.open -= 1
        self.registry.waiting.pop(self, None)
        for timer in (self._request_deadline, self._stall_deadline):
            if timer is not None:
                timer.cancel()
        self._request_deadline = self._stall_deadline = None
        if self.transport is not None:  # None: refused before uvicorn saw it
            super().connection_lost(exc)

    def close(self, why: str) -> None:
        """Close the connection now (it waits for a request, so nothing is lost)."""
        self.registry.waiting.pop(self, None)
        self._request_deadline = None
        if not self.transport.is_closing():
            log.debug("connection from %s closed: %s", self.client, why)
            self.transport.close()

    def _await_request(self) -> None:
        self.registry.waiting.setdefault(self, None)
        if self._request_deadline is None:
            self._request_deadline = self.loop.call_later(self.limits.request_timeout, self.close,
                                                          "no whole request within the request timeout")

    def _request_arrived(self) -> None:
        self.registry.waiting.pop(self, None)
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None

    def _stalled(self) -> None:
        self._stall_deadline = None
        log.info("dropped the connection from %s: it read nothing for %g s", self.client, self.limits.stall_timeout)
        self.transport.abort()  # close() would wait for the client to read what is buffered, forever


class AcceptErrors:
    """An event-loop exception handler that logs asyncio's "socket.accept() out of system resource" at most once per
    ``interval`` seconds (with how many were left out), and passes every other error on.

    On Linux the listening socket stays readable while ``accept()`` fails, and asyncio's accept loop reports the
    error once per connection of the backlog each time it retries: hundreds of tracebacks a second.
    """

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self.suppressed = 0
        self._previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def uninstall(self) -> None:
        if self._loop is not None and self._loop.get_exception_handler() is self:
            self._loop.set_exception_handler(self._previous)
        self._loop = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == self.MESSAGE:
            now = self._clock()
            if self._last is not None and now - self._last < self.interval:
                self.suppressed += 1
                return
            self._last = now
            left_out, self.suppressed = self.suppressed, 0
            log.error("cannot accept connections: %s (%d more left out of the log since the last such record, at "
                      "most one every %g s); lower --max-connections or raise the open-files limit (ulimit -n)",
                      context.get("exception"), left_out, self.interval)
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)
