"""The tool-call benchmark: what calling a tool costs, for a Python tool and for an MCP server (stdio and HTTP).

Two numbers per kind of tool:

- **concurrent**: the wall time of 50 independent calls of a tool that sleeps 200 ms, all started at once. Calls
  that overlap take about 0.2 s; calls that queue behind each other take 10 s.
- **per call**: the mean time of 200 sequential calls of a tool that does nothing, in microseconds; for MCP the
  overhead is that minus the Python tool's.

The MCP server is this module itself (``python -m planweave.bench.tools --serve-mcp [--http PORT]``), so the
benchmark needs nothing but the ``mcp`` package. ``python -m planweave.bench.tools`` prints a table (``--json``:
the dict :func:`measure_tools` returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Annotated

import typer

from planweave.bench.cli import parse_command_line
from planweave.tools.registry import Tool

CONCURRENT_CALLS = 50
CALL_SECONDS = 0.2
SEQUENTIAL_CALLS = 200
WARMUP_CALLS = 10


async def _pause(seconds: float) -> str:
    """Sleep ``seconds``; the Python twin of the MCP server's ``pause`` tool."""
    await asyncio.sleep(seconds)
    return "done"


async def _noop() -> str:
    """Do nothing; the Python twin of the MCP server's ``noop`` tool."""
    return "ok"


async def _concurrent(tool: Tool, n: int = CONCURRENT_CALLS, seconds: float = CALL_SECONDS) -> float:
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(n):
            tg.create_task(tool.invoke({"seconds": seconds}))
    return time.perf_counter() - started


async def _per_call_us(tool: Tool, n: int = SEQUENTIAL_CALLS) -> float:
    for _ in range(WARMUP_CALLS):
        await tool.invoke({})
    started = time.perf_counter()
    for _ in range(n):
        await tool.invoke({})
    return (time.perf_counter() - started) / n * 1e6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def _http_server() -> AsyncIterator[str]:
    """This module's MCP server over streamable HTTP in a subprocess; yields its URL once it accepts connections."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.bench.tools", "--serve-mcp", "--http", str(port),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    if proc.returncode is not None:
                        raise RuntimeError(f"the benchmark MCP server exited with code {proc.returncode}") from None
                    await asyncio.sleep(0.05)  # another process is starting: there is no event to wait for
                else:
                    writer.close()
                    break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def _measure_mcp(spec: str) -> dict[str, float]:
    from planweave.tools.mcp import connect_mcp  # the mcp SDK is imported only when MCP is measured

    async with connect_mcp({"bench": spec}) as box:
        return {
            "concurrent_s": await _concurrent(box["bench.pause"]),
            "per_call_us": await _per_call_us(box["bench.noop"]),
        }


async def measure_tools() -> dict[str, dict[str, float]]:
    """Measure a Python tool, the MCP server over stdio and over HTTP; return seconds and microseconds by kind.

    Each kind has ``concurrent_s`` (50 calls of 200 ms at once) and ``per_call_us`` (200 sequential no-op calls);
    the MCP kinds add ``overhead_us``, their per-call time minus the Python tool's.
    """
    pause = Tool.from_function(_pause, name="pause")
    noop = Tool.from_function(_noop, name="noop")
    results: dict[str, dict[str, float]] = {
        "python": {"concurrent_s": await _concurrent(pause), "per_call_us": await _per_call_us(noop)},
    }
    results["mcp_stdio"] = await _measure_mcp(shlex.join([sys.executable, "-m", "planweave.bench.tools",
                                                          "--serve-mcp"]))
    async with _http_server() as url:
        results["mcp_http"] = await _measure_mcp(url)
    base = results["python"]["per_call_us"]
    for kind in ("mcp_stdio", "mcp_http"):
        results[kind]["overhead_us"] = results[kind]["per_call_us"] - base
    return results


def format_table(results: dict[str, dict[str, float]]) -> str:
    """The results as a plain-text table."""
    serial = CONCURRENT_CALLS * CALL_SECONDS
    lines = [
        f"{'tool':<11} {f'{CONCURRENT_CALLS} x {CALL_SECONDS * 1000:.0f} ms at once':>22} "
        f"{'per no-op call':>15} {'overhead vs Python':>19}",
    ]
    for kind, row in results.items():
        overhead = f"{row['overhead_us']:>14,.0f} us" if "overhead_us" in row else f"{'-':>17}"
        lines.append(
            f"{kind:<11} {row['concurrent_s']:>10.3f} s (of {serial:g} s) {row['per_call_us']:>12,.0f} us "
            f"{overhead:>19}"
        )
    return "\n".join(lines)


def serve_mcp(http_port: int | None) -> None:
    """Run the benchmark's MCP server (tools ``pause`` and ``noop``) on stdio, or streamable HTTP on ``http_port``."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("planweave-bench", log_level="WARNING")
    server.add_tool(_pause, name="pause", structured_output=False)
    server.add_tool(_noop, name="noop", structured_output=False)
    if http_port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=http_port)


def _options(
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
    serve: Annotated[bool, typer.Option("--serve-mcp", hidden=True)] = False,
    http: Annotated[int | None, typer.Option("--http", hidden=True)] = None,
) -> tuple[bool, bool, int | None]:
    """Benchmark tool calls: a Python tool vs MCP over stdio and HTTP."""
    return json_output, serve, http


def main(argv: Sequence[str] | None = None) -> int:
    """Print the benchmark table (or JSON); with ``--serve-mcp``, be the benchmark's MCP server instead."""
    as_json, serve, http = parse_command_line(_options, argv, "python -m planweave.bench.tools")
    if serve:
        serve_mcp(http)
        return 0
    results = asyncio.run(measure_tools())
    print(json.dumps(results, indent=2) if as_json else format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
