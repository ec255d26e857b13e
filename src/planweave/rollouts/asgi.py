"""Serve an ASGI app with uvicorn inside the running event loop, on 127.0.0.1 and a free port (or the one given):
what the rollout gateway and the toy policy server run on (the ``server`` extra)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from planweave.core.errors import PlanweaveError
from planweave.extras import require


@contextlib.asynccontextmanager
async def serve_app(app: Any, *, host: str = "127.0.0.1", port: int = 0, what: str = "server") -> AsyncIterator[str]:
    """Serve ``app`` for the ``async with`` block and yield its ``http://host:port`` URL; stop it on exit."""
    require("server", what)
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}"
    # log_config and log_level None: an embedded server leaves the process's logging alone (uvicorn's default config
    # and a log level would set its loggers' propagation and levels for the rest of the process, hiding every later
    # server's access log).
    server = uvicorn.Server(uvicorn.Config(app, log_level=None, log_config=None, lifespan="off",
                                           timeout_keep_alive=30, access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]), name=f"{what} on {url}")
    try:
        while not server.started:  # uvicorn offers no readiness event but this flag
            if serving.done():
                await serving
                raise PlanweaveError(f"{what} did not start on {url}")
            await asyncio.sleep(0.005)
        yield url
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        sock.close()
