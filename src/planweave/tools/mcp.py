"""MCP servers as planweave tools: each server's tools become ``NAME.tool`` entries of a :class:`Toolbox`.

A server is named by a spec: a command line (``npx -y @modelcontextprotocol/server-filesystem ./data``, started
as a subprocess and spoken to over stdio) or an ``http(s)://`` URL (streamable HTTP). :func:`connect_mcp` starts or
connects every server once, lists its tools and keeps the connection for the life of the ``async with`` block; a
supervisor task per server owns the connection and restarts a server that dies, a bounded number of times.

Importing this module imports the ``mcp`` SDK (about a second); nothing else in planweave imports it, so Python
tools pay nothing for MCP support.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shlex
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

import jsonschema

try:
    import anyio
    import mcp_types
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
except ModuleNotFoundError:  # the MCP SDK: name the extra that brings it
    from planweave.extras import require

    require("mcp", "planweave.tools.mcp (MCP servers)")
    raise

from planweave.core.errors import PlanweaveError, ToolError, did_you_mean
from planweave.tools.registry import Tool, Toolbox

__all__ = ["MCPServer", "MCPServerError", "MCPTool", "ServerConnection", "connect_mcp"]

log = logging.getLogger("planweave.tools.mcp")

SERVER_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
MAX_RESTARTS = 3
RESTART_BACKOFF = 0.5  # seconds before the first restart; doubled for each further one
CONNECT_TIMEOUT = 60.0  # seconds for a server to start and list its tools (npx may download on first use)
_LIST_PAGES = 100  # a tools/list that paginates past this is a broken server, not a big one


class MCPServerError(PlanweaveError):
    """An MCP server spec is malformed, or the server could not be started, connected or listed."""


# -- specs ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MCPServer:
    """An MCP server to connect to: ``name`` prefixes its tools; ``spec`` is a command line or an http(s) URL.

    ``env`` adds variables to the small environment a stdio server gets (``HOME``, ``PATH``, ``USER`` ...: the SDK
    does not pass the rest of planweave's environment, so secrets stay out unless given here); ``cwd`` is its
    working directory.
    """

    name: str
    spec: str
    env: Mapping[str, str] | None = None
    cwd: Path | None = None

    def __post_init__(self) -> None:
        if not SERVER_NAME_PATTERN.match(self.name):
            raise MCPServerError(
                f"MCP server name {self.name!r} must be letters, digits, '_' or '-' (it prefixes tool names as "
                f"'{self.name}.TOOL')"
            )
        if not self.spec.strip():
            raise MCPServerError(f"MCP server '{self.name}': empty spec (give a command line or an http(s) URL)")
        if self.transport == "stdio":
            self.argv  # noqa: B018 -- parse now so a bad spec fails before anything starts

    @classmethod
    def parse(cls, text: str) -> MCPServer:
        """Parse ``NAME=SPEC`` as given to ``--mcp`` (``fs=npx -y pkg ./data`` or ``web=http://host:port/mcp``)."""
        name, sep, spec = text.partition("=")
        if not sep:
            raise MCPServerError(f"--mcp {text!r}: expected NAME=SPEC, e.g. fs='npx -y server-filesystem ./data'")
        return cls(name.strip(), spec.strip())

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """``http`` for an http(s) URL (streamable HTTP), ``stdio`` for a command line."""
        return "http" if re.match(r"^https?://", self.spec.strip(), re.IGNORECASE) else "stdio"

    @property
    def argv(self) -> list[str]:
        """The command line of a stdio server, split like a POSIX shell would (no shell runs it)."""
        try:
            argv = shlex.split(self.spec)
        except ValueError as exc:
            raise MCPServerError(f"MCP server '{self.name}': cannot parse command {self.spec!r}: {exc}") from None
        if not argv:
            raise MCPServerError(f"MCP server '{self.name}': empty command")
        return argv

    def __str__(self) -> str:
        return f"MCP server '{self.name}' ({self.spec})"


# -- argument validation --------------------------------------------------------------------------------------------
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), ((list, tuple), "array"),
    (dict, "object"), (type(None), "null"),
)


def _json_type(value: Any) -> str:
    for py, name in _JSON_TYPES:
        if isinstance(value, py):
            return name
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class ArgumentSchema:
    """Checks tool arguments against a JSON schema, reporting problems per argument.

    Unknown arguments are rejected unless the schema allows them explicitly (``additionalProperties`` true or a
    schema, or ``patternProperties``): many servers omit ``additionalProperties: false`` yet ignore unknown
    arguments, which would hide a misspelt argument until the results come out wrong.
    """

    def __init__(self, tool: str, schema: Mapping[str, Any]) -> None:
        self.tool = tool
        self.schema = dict(schema)
        props = self.schema.get("properties")
        self.properties: tuple[str, ...] = tuple(props) if isinstance(props, Mapping) else ()
        extra = self.schema.get("additionalProperties")
        self.closed = "additionalProperties" not in self.schema and "patternProperties" not in self.schema
        self.closed = self.closed or extra is False
        self.validator: jsonschema.protocols.Validator | None
        cls = jsonschema.validators.validator_for(self.schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            log.warning("tool '%s' has an invalid input schema (%s); its arguments are not checked", tool,
                        exc.message)
            self.validator = None
        else:
            self.validator = cls(self.schema)

    def problems(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Return ``(argument, message)`` for every problem; arguments in ``deferred`` are not judged."""
        out: list[tuple[str, str]] = []
        if self.closed:
            for name in args:
                if name not in self.properties:
                    hint = did_you_mean(name, self.properties)
                    known = f"; it takes {', '.join(self.properties)}" if self.properties and not hint else ""
                    out.append((name, f"tool '{self.tool}' has no argument '{name}'{hint}{known}"))
        if self.validator is None:
            return out
        for err in sorted(self.validator.iter_errors(dict(args)), key=lambda e: list(map(str, e.path))):
            path = list(err.path)
            if path and path[0] in deferred:
                continue
            if err.validator == "required":
                wanted = err.validator_value if isinstance(err.validator_value, list) else []
                have = err.instance if isinstance(err.instance, Mapping) else {}
                missing = [p for p in wanted if p not in have]
                if not path:
                    out.extend((p, f"required by tool '{self.tool}'") for p in missing)
                else:
                    out.extend((_where([*path, p]), "required") for p in missing)
            elif err.validator == "additionalProperties" and not path:
                continue  # reported above, with a suggestion
            elif not path and deferred:
                continue  # a whole-object rule (oneOf, dependencies...) cannot be judged with references unresolved
            elif err.validator == "type":
                expected = err.validator_value
                want = " or ".join(expected) if isinstance(expected, list) else str(expected)
                out.append((_where(path) or "args",
                            f"expected {want}, got {_json_type(err.instance)} {_short(err.instance)}"))
            else:
                out.append((_where(path) or "args", err.message))
        return out


# -- results --------------------------------------------------------------------------------------------------------
def _output(result: mcp_types.CallToolResult) -> Any:
    """Structured content when the server sent it, else the text (one block) or a list of blocks."""
    if result.structured_content is not None:
        return result.structured_content
    blocks: list[Any] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            blocks.append(block.text)
        else:
            blocks.append(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    if not blocks:
        return None
    if len(blocks) == 1:
        return blocks[0]
    return blocks


def _error_text(result: mcp_types.CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, mcp_types.TextContent) and b.text.strip()]
    if texts:
        return " | ".join(t.strip() for t in texts)
    if result.structured_content is not None:
        return _short(result.structured_content, 500)
    return "no details given"


def _describe(exc: BaseException) -> str:
    """One line for an exception, unwrapping the exception groups anyio task groups raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- the connection -------------------------------------------------------------------------------------------------
class _WatchedReadStream:
    """Passes a transport's read stream through, calling ``on_end`` once when it ends (the server went away).

    The SDK reports a dead stdio server only to requests in flight; this is how the supervisor notices an idle
    server's death and restarts it before the next call needs it.
    """

    def __init__(self, inner: Any, on_end: Any) -> None:
        self._inner = inner
        self._on_end = on_end

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None


@contextlib.asynccontextmanager
async def _watched(transport: Any, on_end: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream


class ServerConnection:
    """One MCP server's connection: started once, restarted (at most ``max_restarts`` times) when it dies.

    :meth:`supervise` runs for the life of the connection in a task of :func:`connect_mcp`'s TaskGroup and owns
    the SDK client (whose anyio task group must be entered and left by one task); tool calls from step tasks
    share that client, so concurrent calls are multiplexed over one session.
    """

    def __init__(
        self, server: MCPServer, *, errlog: TextIO | None = None, max_restarts: int = MAX_RESTARTS,
        restart_backoff: float = RESTART_BACKOFF,
    ) -> None:
        self.server = server
        self.max_restarts = max_restarts
        self.restart_backoff = restart_backoff
        self.restarts = 0
        self.listing: list[mcp_types.Tool] = []
        self._errlog = errlog
        self._client: Client | None = None
        self._generation = 0
        self._wake = asyncio.Event()  # the current connection was lost, or close() was called
        self._closing = False
        self._failure: str | None = None  # set when the server is given up on: calls fail at once
        self._changed = asyncio.Event()  # replaced by a fresh one each time it is set: "the state changed"
        self._first = asyncio.get_running_loop().create_future()  # resolved once: started, or why not

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def _transport(self, wake: asyncio.Event) -> Any:
        server = self.server
        if server.transport == "http":
            inner: Any = streamable_http_client(server.spec.strip())
        else:
            command, *args = server.argv
            params = StdioServerParameters(
                command=command, args=args, env=dict(server.env) if server.env else None,
                cwd=str(server.cwd) if server.cwd else None,
            )
            inner = stdio_client(params, errlog=self._errlog or sys.stderr)

        def ended() -> None:
            if wake is self._wake:  # drop the dead client now, so new calls wait for the restart
                self._client = None
            wake.set()

        return _watched(inner, ended)

    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise MCPServerError(f"{self.server}: tools/list returned more than {_LIST_PAGES} pages")

    def _publish(self, client: Client | None, failure: str | None = None) -> None:
        self._client = client
        if client is not None:
            self._generation += 1
        if failure is not None:
            self._failure = failure
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def supervise(self) -> None:
        """Connect, serve until the connection is lost or :meth:`close` is called, restart; never raises."""
        while True:
            wake = self._wake = asyncio.Event()
            error: str | None = None
            try:
                async with Client(self._transport(wake), cache=None) as client:
                    if not self._first.done():
                        self.listing = await self._list_tools(client)
                    self._publish(client)
                    if not self._first.done():
                        self._first.set_result(None)
                    if not self._closing:
                        await wake.wait()
            except asyncio.CancelledError:
                self._publish(None, f"{self.server} was closed")
                if not self._first.done():
                    self._first.cancel()
                raise
            except Exception as exc:  # the SDK raises exception groups and transport errors of many kinds
                error = _describe(exc)
            self._publish(None)
            if self._closing:
                self._publish(None, f"{self.server} was closed")
                return
            if not self._first.done():
                self._first.set_exception(MCPServerError(f"cannot start {self.server}: {error or 'no answer'}"))
                self._publish(None, f"{self.server} could not be started: {error}")
                return
            if self.restarts >= self.max_restarts:
                limit = f"{self.max_restarts} restart{'s' if self.max_restarts != 1 else ''}"
                self._publish(None, f"{self.server} stopped {self.restarts + 1} times and is not restarted "
                                          f"again (at most {limit})")
                log.error("%s stopped again and is given up on", self.server)
                return
            self.restarts += 1
            delay = self.restart_backoff * 2 ** (self.restarts - 1)
            log.warning("%s stopped (%s); restart %d of %d in %.1fs", self.server, error or "connection closed",
                        self.restarts, self.max_restarts, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wake.wait()  # close() cuts the backoff short
            if self._closing:
                self._publish(None, f"{self.server} was closed")
                return

    async def started(self) -> None:
        """Wait until the server answered its first tools/list; raise :class:`MCPServerError` if it could not."""
        await asyncio.shield(self._first)

    @property
    def is_started(self) -> bool:
        """Whether the first connection succeeded."""
        return self._first.done() and not self._first.cancelled() and self._first.exception() is None

    def close(self) -> None:
        """Ask the supervisor to disconnect (a stdio server gets EOF on stdin, then SIGTERM, then SIGKILL)."""
        self._closing = True
        self._wake.set()

    # -- calls --------------------------------------------------------------------------------------------------
    async def _current(self, qualified: str) -> tuple[Client, int, int]:
        """The live client, its generation and the restarts used before it; waits while a restart is under way."""
        while self._client is None:
            if self._failure is not None:
                raise ToolError(f"cannot call '{qualified}': {self._failure}", kind="mcp_crashed", retryable=False)
            await self._changed.wait()
        return self._client, self._generation, self.restarts

    def _lost(self, generation: int) -> None:
        if generation == self._generation and self._client is not None:
            self._client = None
            self._wake.set()

    async def call(self, tool: str, qualified: str, args: Mapping[str, Any]) -> Any:
        """Call ``tool`` on the server with ``args``; return its output or raise :class:`ToolError`."""
        client, generation, restarts = await self._current(qualified)
        try:
            result = await client.call_tool(tool, dict(args))
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._lost(generation)
                raise self._crashed(qualified, restarts) from None
            raise ToolError(f"{self.server} rejected the call to '{qualified}': {exc.message} (code {exc.code})",
                            kind="mcp_error") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            self._lost(generation)
            raise self._crashed(qualified, restarts, _describe(exc)) from None
        except Exception as exc:  # a malformed result, an output that fails its schema, ...
            raise ToolError(f"{self.server}: the call to '{qualified}' failed: {_describe(exc)}",
                            kind="mcp_error") from None
        if result.is_error:
            raise ToolError(f"'{qualified}' failed: {_error_text(result)}", kind="mcp_error")
        return _output(result)

    def _crashed(self, qualified: str, restarts: int, detail: str = "") -> ToolError:
        """The error for a call whose connection died; ``restarts`` were used before that connection."""
        what = "exited or crashed" if self.server.transport == "stdio" else "stopped answering"
        left = self.max_restarts - restarts
        verb = "restarted" if self.server.transport == "stdio" else "reconnected"
        then = (f"it is being {verb} (restart {restarts + 1} of at most {self.max_restarts})"
                if left > 0 else f"it is not {verb} again")
        because = f": {detail}" if detail else ""
        return ToolError(f"{self.server} {what} during the call to '{qualified}'{because}; {then}",
                         kind="mcp_crashed", retryable=left > 0)


# -- tools ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MCPTool(Tool):
    """A tool of an MCP server, named ``SERVER.tool``; its arguments are checked against the server's schema."""

    server: str
    remote_name: str
    schema: ArgumentSchema = field(repr=False, compare=False)

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Validate literal arguments against the tool's JSON schema; arguments in ``deferred`` are skipped."""
        return self.schema.problems(args, deferred)

    def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate resolved arguments (raises ToolError kind ``arguments``, not retryable) and copy them."""
        problems = self.schema.problems(args, frozenset())
        if problems:
            details = "; ".join(f"{where}: {message}" for where, message in problems)
            raise ToolError(f"bad arguments for tool '{self.name}': {details}", kind="arguments", retryable=False)
        return dict(args)

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Validate the arguments, call the server, return structured content, else the text content(s)."""
        return await self.fn(**self.bind(args))


def _make_tool(connection: ServerConnection, spec: mcp_types.Tool) -> MCPTool:
    qualified = f"{connection.server.name}.{spec.name}"

    async def call(**kwargs: Any) -> Any:
        return await connection.call(spec.name, qualified, kwargs)

    call.__name__ = call.__qualname__ = qualified
    schema = dict(spec.input_schema or {"type": "object"})
    return MCPTool(
        name=qualified,
        fn=call,
        description=(spec.description or spec.title or "").strip(),
        idempotent=False,  # a server's idempotentHint is its own claim; a plan step can say idempotent: true
        args_model=None,
        accepts_extra=False,
        input_schema=schema,
        is_async=True,
        server=connection.server.name,
        remote_name=spec.name,
        schema=ArgumentSchema(qualified, schema),
    )


def _servers(servers: Mapping[str, str] | Iterable[MCPServer]) -> list[MCPServer]:
    if isinstance(servers, Mapping):
        return [MCPServer(name, spec) for name, spec in servers.items()]
    out = list(servers)
    seen: set[str] = set()
    for server in out:
        if server.name in seen:
            raise MCPServerError(f"two MCP servers are named '{server.name}'")
        seen.add(server.name)
    return out


@contextlib.asynccontextmanager
async def connect_mcp(
    servers: Mapping[str, str] | Iterable[MCPServer],
    *,
    errlog: TextIO | None = None,
    max_restarts: int = MAX_RESTARTS,
    restart_backoff: float = RESTART_BACKOFF,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> AsyncIterator[Toolbox]:
    """Start or connect every server once and yield a Toolbox of their tools, named ``NAME.tool``.

    ``servers`` maps names to specs (``{"fs": "npx -y @modelcontextprotocol/server-filesystem ./data",
    "web": "http://127.0.0.1:8931/mcp"}``) or lists :class:`MCPServer`. Servers start concurrently; if one cannot
    be started or listed within ``connect_timeout`` seconds, :class:`MCPServerError` names it and the others are
    stopped. Leaving the block disconnects every server. A stdio server's stderr goes to ``errlog`` (default
    ``sys.stderr``). A server that dies is restarted, at most ``max_restarts`` times, after a backoff starting at
    ``restart_backoff`` seconds and doubling.
    """
    specs = _servers(servers)
    try:
        async with asyncio.TaskGroup() as tg:
            connections = [ServerConnection(s, errlog=errlog, max_restarts=max_restarts,
                                            restart_backoff=restart_backoff) for s in specs]
            tasks = [tg.create_task(c.supervise(), name=f"planweave-mcp-{c.server.name}") for c in connections]
            try:
                try:
                    async with asyncio.timeout(connect_timeout):
                        for conn in connections:
                            await conn.started()
                except TimeoutError:
                    slow = [str(c.server) for c in connections if not c.is_started]
                    raise MCPServerError(
                        f"cannot start {', '.join(slow)}: no answer to tools/list within {connect_timeout:g}s"
                    ) from None
                box = Toolbox()
                for conn in connections:
                    for spec in conn.listing:
                        box.add(_make_tool(conn, spec))
                yield box
            finally:
                for conn, task in zip(connections, tasks, strict=True):
                    conn.close()
                    if not conn.is_started:
                        task.cancel()  # still starting: do not wait for a server nobody will use
    except BaseExceptionGroup as group:
        # Supervisors never raise, so the group holds just the exception of the block (or of the startup above):
        # Python 3.11's TaskGroup wraps even that one. Hand it on as it was raised.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
