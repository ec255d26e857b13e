"""An MCP server for planweave's tests: quick tools, a slow one, one that crashes the process and one that hangs.

Run ``python pw_test_server.py`` for stdio, or ``python pw_test_server.py --http PORT`` for streamable HTTP on
127.0.0.1:PORT/mcp.
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("pw-test")


@server.tool()
def echo(text: str) -> str:
    """Return ``text`` unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@server.tool()
def stats(values: list[float]) -> dict[str, float]:
    """Return the count, sum and mean of ``values`` as structured content."""
    total = sum(values)
    return {"count": len(values), "sum": total, "mean": total / len(values) if values else 0.0}


@server.tool()
async def pause(ms: int) -> str:
    """Sleep ``ms`` milliseconds, then return ``"done"``."""
    await anyio.sleep(ms / 1000)
    return "done"


@server.tool()
def pid() -> int:
    """Return the server's process id (tests use it to see a restart)."""
    return os.getpid()


@server.tool()
def fail(message: str) -> str:
    """Fail with ``message`` (the client sees an isError result carrying it)."""
    raise ToolError(message)


@server.tool()
def crash() -> str:
    """Kill the server process in the middle of the call."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never return."""
    await anyio.sleep_forever()
    return "unreachable"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    opts = parser.parse_args()
    if opts.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=opts.http)


if __name__ == "__main__":
    main()
