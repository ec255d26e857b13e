"""MCP servers as tools, against the real reference servers from npm and a small Python server of our own.

The npm servers come from ``scripts/install-mcp-servers.sh`` (into ``.cache/mcp``, or ``$PLANWEAVE_MCP_CACHE``);
a test fails, not skips, when they are missing. ``servers/pw_test_server.py`` adds the misbehaviour the reference
servers lack: a tool that kills its process mid-call, one that hangs, a slow one.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, Event, PlanInvalid, RunResult, Toolbox, ToolError, parse_plan_document, validate_plan
from planweave.journal.memory import MemoryJournal
from planweave.tools.mcp import MCPServer, MCPServerError, MCPTool, connect_mcp

REPO = Path(__file__).resolve().parents[2]
TEST_SERVER_PY = Path(__file__).parent / "servers" / "pw_test_server.py"
TEST_SERVER = shlex.join([sys.executable, str(TEST_SERVER_PY)])


def npm_server(name: str) -> str:
    """The path of an MCP server binary installed by scripts/install-mcp-servers.sh; fail the test if missing."""
    cache = Path(os.environ.get("PLANWEAVE_MCP_CACHE", REPO / ".cache" / "mcp"))
    path = cache / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {cache}: run scripts/install-mcp-servers.sh", pytrace=False)
    return str(path)


async def run(box: Toolbox, plan: Mapping[str, Any], kinds: dict[str, str] | None = None) -> RunResult:
    """Run ``plan`` with ``box`` on a memory journal; record each failed step's error kind in ``kinds``."""
    async with Engine(MemoryJournal(), tools=box) as engine:
        if kinds is not None:
            def listen(event: Event) -> None:
                if event.kind == "step_failed" and event.step is not None:
                    kinds[event.step] = event.data["kind"]
            engine.subscribe(listen)
        started = await engine.start(plan)
        return await started.wait()


@pytest.fixture
async def test_box() -> AsyncIterator[Toolbox]:
    async with connect_mcp({"t": TEST_SERVER}, restart_backoff=0.05) as box:
        yield box


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The test server over streamable HTTP on a free port of 127.0.0.1; yields its URL once it accepts."""
    port = free_port()
    with open(tmp_path / "http-server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(TEST_SERVER_PY), "--http", str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the HTTP test server did not start: {(tmp_path / 'http-server.log').read_text()}"
                    ) from None
                time.sleep(0.05)  # waiting on another process to listen: there is no event to wait for
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


# -- specs -----------------------------------------------------------------------------------------------------------
def test_a_command_spec_is_split_like_a_shell_and_a_url_is_streamable_http() -> None:
    fs = MCPServer.parse("fs=npx -y @modelcontextprotocol/server-filesystem './my data'")
    assert (fs.name, fs.transport) == ("fs", "stdio")
    assert fs.argv == ["npx", "-y", "@modelcontextprotocol/server-filesystem", "./my data"]
    web = MCPServer.parse("web=http://127.0.0.1:8931/mcp")
    assert (web.name, web.transport, web.spec) == ("web", "http", "http://127.0.0.1:8931/mcp")


@pytest.mark.parametrize(("text", "message"), [
    ("fs", "expected NAME=SPEC"),
    ("a.b=cmd", "must be letters, digits"),
    ("fs=", "empty spec"),
    ("fs=npx 'unclosed", "cannot parse command"),
])
def test_a_bad_spec_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(MCPServerError, match=message):
        MCPServer.parse(text)


async def test_a_server_that_cannot_start_is_named_and_the_others_are_stopped() -> None:
    servers = {"t": TEST_SERVER, "bad": "/nonexistent/mcp-server"}
    with pytest.raises(MCPServerError) as err:
        async with connect_mcp(servers):
            pytest.fail("connect_mcp yielded although a server could not start")
    assert str(err.value) == (
        "cannot start MCP server 'bad' (/nonexistent/mcp-server): "
        "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/mcp-server'"
    )


def test_importing_planweave_does_not_import_the_mcp_sdk() -> None:
    code = "import sys, planweave, planweave.tools; assert 'mcp' not in sys.modules, 'mcp imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the reference servers -------------------------------------------------------------------------------------------
async def test_lists_the_tools_of_both_reference_servers_under_their_names(tmp_path: Path) -> None:
    servers = {"everything": npm_server("mcp-server-everything"),
               "fs": shlex.join([npm_server("mcp-server-filesystem"), str(tmp_path)])}
    async with connect_mcp(servers) as box:
        names = set(box)
        assert {"everything.echo", "everything.get-sum", "fs.read_text_file", "fs.list_directory"} <= names
        assert all(n.startswith(("everything.", "fs.")) for n in names)
        echo = box["everything.echo"]
        assert isinstance(echo, MCPTool)
        assert echo.description == "Echoes back the input string"
        assert echo.input_schema["properties"]["message"]["type"] == "string"
        assert echo.idempotent is False


async def test_calls_echo_and_sum_on_server_everything() -> None:
    async with connect_mcp({"everything": npm_server("mcp-server-everything")}) as box:
        assert await box["everything.echo"].invoke({"message": "hello"}) == "Echo: hello"
        assert await box["everything.get-sum"].invoke({"a": 2, "b": 40}) == "The sum of 2 and 40 is 42."
        result = await run(box, {"steps": [
            {"id": "sum", "tool": "everything.get-sum", "args": {"a": 1, "b": 2}},
            {"id": "echo", "tool": "everything.echo", "args": {"message": "${sum}"}},
        ]})
        assert result.ok, result.error
        assert result.outputs["echo"] == "Echo: The sum of 1 and 2 is 3."


async def test_reads_a_file_through_server_filesystem_only_inside_its_root(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello from disk")
    spec = shlex.join([npm_server("mcp-server-filesystem"), str(tmp_path)])
    async with connect_mcp({"fs": spec}) as box:
        result = await run(box, {"steps": [
            {"id": "read", "tool": "fs.read_text_file", "args": {"path": str(tmp_path / "notes.txt")}},
        ]})
        assert result.ok, result.error
        assert result.outputs["read"] == {"content": "hello from disk"}
        with pytest.raises(ToolError, match=r"'fs.read_text_file' failed: Access denied") as err:
            await box["fs.read_text_file"].invoke({"path": "/etc/hostname"})
        assert err.value.kind == "mcp_error"


async def test_schema_errors_are_caught_when_the_plan_is_validated() -> None:
    async with connect_mcp({"everything": npm_server("mcp-server-everything")}) as box:
        plan = parse_plan_document({"steps": [
            {"id": "typo", "tool": "everything.echo", "args": {"mesage": "hi"}},
            {"id": "type", "tool": "everything.get-sum", "args": {"a": "one", "b": 2}},
            {"id": "ok", "tool": "everything.echo", "args": {"message": "${type}"}},
        ]})
        with pytest.raises(PlanInvalid) as err:
            validate_plan(plan, box)
        text = str(err.value)
        assert ("step 'typo', args.mesage: tool 'everything.echo' has no argument 'mesage' (did you mean 'message'?)"
                in text)
        assert "step 'typo', args.message: required by tool 'everything.echo'" in text
        assert "step 'type', args.a: expected number, got string 'one'" in text
        assert "step 'ok'" not in text  # a reference is judged when it is resolved, not before
        assert len(err.value.problems) == 3


async def test_arguments_are_checked_again_at_call_time(test_box: Toolbox) -> None:
    add = test_box["t.add"]
    assert add.check_args({"a": "${x.count}", "b": 1}, frozenset({"a"})) == []
    with pytest.raises(ToolError, match=r"bad arguments for tool 't.add': a: expected integer, got string '1'") as err:
        await add.invoke({"a": "1", "b": 2})
    assert (err.value.kind, err.value.retryable) == ("arguments", False)


# -- results and failures ---------------------------------------------------------------------------------------------
async def test_structured_content_is_the_output_and_is_error_fails_the_step(test_box: Toolbox) -> None:
    assert await test_box["t.stats"].invoke({"values": [1, 2, 3]}) == {"count": 3, "sum": 6, "mean": 2}
    kinds: dict[str, str] = {}
    result = await run(test_box, {"steps": [{"id": "f", "tool": "t.fail", "args": {"message": "disk is full"}}]},
                       kinds)
    assert result.status == "failed"
    assert result.summary["steps"]["f"]["error"] == "'t.fail' failed: Error executing tool fail: disk is full"
    assert kinds == {"f": "mcp_error"}


async def test_a_server_crashing_mid_call_fails_the_step_and_is_restarted(test_box: Toolbox) -> None:
    before = await test_box["t.pid"].invoke({})
    kinds: dict[str, str] = {}
    result = await run(test_box, {"steps": [{"id": "boom", "tool": "t.crash"}]}, kinds)
    assert result.status == "failed"
    error = result.summary["steps"]["boom"]["error"]
    assert error.startswith(f"MCP server 't' ({TEST_SERVER}) exited or crashed during the call to 't.crash'")
    assert "restarted" in error
    assert kinds == {"boom": "mcp_crashed"}
    result = await run(test_box, {"steps": [{"id": "again", "tool": "t.pid"}]})
    assert result.ok, result.error
    assert result.outputs["again"]["result"] != before["result"]  # a new process


@pytest.mark.slow
async def test_restarts_are_bounded_and_then_calls_fail_at_once() -> None:
    async with connect_mcp({"t": TEST_SERVER}, max_restarts=1, restart_backoff=0.01) as box:
        with pytest.raises(ToolError, match="it is being restarted"):
            await box["t.crash"].invoke({})
        with pytest.raises(ToolError, match="it is not restarted again") as err:
            await box["t.crash"].invoke({})
        assert err.value.retryable is False
        with pytest.raises(ToolError, match=r"cannot call 't.echo': MCP server 't' .* not restarted again") as err:
            await box["t.echo"].invoke({"text": "x"})
        assert (err.value.kind, err.value.retryable) == ("mcp_crashed", False)


async def test_a_hanging_tool_hits_the_step_timeout_and_later_calls_still_work(test_box: Toolbox) -> None:
    pid = await test_box["t.pid"].invoke({})
    started = time.perf_counter()
    result = await run(test_box, {"steps": [{"id": "stuck", "tool": "t.hang", "timeout": 0.5}]})
    assert result.status == "failed"
    assert result.summary["steps"]["stuck"]["error"] == "timed out after 0.5s"
    assert time.perf_counter() - started < 5
    echoes = await asyncio.gather(*(test_box["t.echo"].invoke({"text": str(i)}) for i in range(5)))
    assert echoes == [{"result": str(i)} for i in range(5)]
    assert await test_box["t.pid"].invoke({}) == pid  # the same session: nothing was restarted


async def test_streamable_http_transport(http_server: str) -> None:
    async with connect_mcp({"web": http_server}) as box:
        assert {"web.echo", "web.add", "web.hang"} <= set(box)
        assert await box["web.add"].invoke({"a": 20, "b": 22}) == {"result": 42}
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await box["web.hang"].invoke({})
        assert await box["web.echo"].invoke({"text": "still here"}) == {"result": "still here"}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_fifty_concurrent_calls_overlap(transport: str, request: pytest.FixtureRequest) -> None:
    spec = TEST_SERVER if transport == "stdio" else request.getfixturevalue("http_server")
    async with connect_mcp({"t": spec}) as box:
        plan = {"steps": [{"id": f"s{i}", "tool": "t.pause", "args": {"ms": 200}} for i in range(50)]}
        started = time.perf_counter()
        result = await run(box, plan)
        wall = time.perf_counter() - started
    assert result.ok, result.error
    print(f"\n50 concurrent 200 ms MCP calls over {transport}: {wall:.3f} s (serial would be 10 s)")
    assert wall < 3.0


async def test_an_error_inside_the_block_comes_out_as_itself() -> None:
    with pytest.raises(KeyError, match=r"everything\.nope"):
        async with connect_mcp({"everything": npm_server("mcp-server-everything")}) as box:
            box["everything.nope"]
