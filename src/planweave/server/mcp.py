"""The HTTP API as an MCP server: ``planweave mcp`` (stdio) and ``/mcp`` on ``planweave serve`` (streamable HTTP).

An adapter, not a second implementation: every tool is one request to the server's own routes, made in-process
(:class:`RunsAPI`, an ASGI transport over the FastAPI app), so MCP clients get what ``POST /runs``,
``GET /runs/{id}`` (:mod:`planweave.runview`'s report), the approval and input routes and ``cancel`` give HTTP
clients: the same validation, limits, caps, redaction and errors. A refusal (4xx) becomes a tool result with
``isError`` naming what was wrong; arguments the tool's schema refuses are an ``isError`` result too, and a
malformed request a JSON-RPC error, from the SDK.

``wait_run`` follows the run's journaled events (:func:`~planweave.server.streams.run_events`, the stream behind
``GET /runs/{id}/events``) and sends an MCP progress notification when it begins and as the run's steps end. It
answers with the run's report and ``task_status`` in the MCP Tasks vocabulary: ``working`` (still running when the
wait ran out), ``input_required`` (a step waits for an approval or a ``human.input`` value: ``questions`` says
which), ``completed``, ``failed``, ``cancelled``, or ``interrupted`` (no process runs it). The ``mcp`` SDK installed
here (2.3) serves no ``tasks/*`` methods (the 2026-07-28 protocol moved Tasks out of the core), so long runs are
followed this way.

Everything a tool returns, every error and every progress message passes through the process's secret redaction
(:func:`~planweave.tools.safety.redact`) once more on the way out. The SDK is imported only when an MCP server is
built: ``/mcp`` answers 501 naming the ``mcp`` extra where it is not installed.
"""

# No ``from __future__ import annotations``: the tools below are closures whose annotations name the SDK's
# ``Context``, imported only where they are built; the SDK finds that parameter from the evaluated annotation.

import asyncio
import contextlib
import inspect
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from planweave import __version__
from planweave.server.streams import run_events
from planweave.tools.safety import redact, secret_values

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context, MCPServer

    from planweave.server.app import AppState

__all__ = ["APIRefused", "RunsAPI", "TaskStatus", "build_mcp_server", "mount_mcp", "task_status"]

MCP_PATH = "/mcp"
#: Who a reply given over MCP is journaled as (``by``: the HTTP API's "the API token's holder at ...").
MCP_CLIENT = ("an MCP client", 0)
#: The longest ``wait_run`` (and ``wait_s`` of the start tools) in seconds: a client waits longer by calling again.
MAX_WAIT_S = 3600.0

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled", "interrupted"]
_ENDED: dict[str, TaskStatus] = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled",
                                  "unreadable": "failed", "interrupted": "interrupted"}
#: The events after which ``wait_run`` reads the run again: a step ended or started waiting, or the run ended.
_TURNS = frozenset({"step_succeeded", "step_failed", "step_skipped", "step_cancelled", "approval_requested",
                    "input_requested", "approval_given", "input_given", "run_finished", "run_resumed"})
_STEP_ENDED = frozenset({"succeeded", "failed", "skipped", "cancelled"})


def task_status(report: dict[str, Any]) -> TaskStatus:
    """The MCP Tasks status of a run report (``GET /runs/{id}``): ``input_required`` while a step waits for a
    person, ``interrupted`` when no process runs it, else by how it ended, ``working`` until then."""
    status = str(report.get("status"))
    if status in _ENDED:
        return _ENDED[status]
    return "input_required" if report.get("waiting") else "working"


class APIRefused(Exception):
    """The API refused a tool's request (4xx/5xx): ``status`` and the body's ``detail`` (and problems, if any)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(_refusal_text(status, body))


def _refusal_text(status: int, body: Any) -> str:
    if not isinstance(body, dict):
        return f"HTTP {status}: {body}"
    text = str(body.get("detail", body))
    problems = body.get("problems") or []
    lines = [": ".join(str(part) for part in (p.get("step"), p.get("field"), p.get("message")) if part)
             for p in problems if isinstance(p, dict) and str(p.get("message")) not in text]
    if lines:
        text += "\n" + "\n".join(f"- {line}" for line in lines)
    if isinstance(body.get("decision"), dict):
        text += "\nthe reply that stands: " + json.dumps(body["decision"], default=str)
    return text


class RunsAPI:
    """The server's HTTP API called in-process (no socket): what every MCP tool asks, with the server's token."""

    def __init__(self, app: FastAPI, token: str) -> None:
        self.app = app
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=MCP_CLIENT), base_url="http://planweave.mcp",
            headers={"Authorization": f"Bearer {token}"}, timeout=None)

    @property
    def state(self) -> "AppState":
        """The app's shared state (engine, journal, change feed): what ``wait_run`` follows events with."""
        state: AppState = self.app.state.planweave
        return state

    async def request(self, method: str, path: str, *, body: Any = None,
                      params: dict[str, Any] | None = None) -> httpx.Response:
        """One request; raises :class:`APIRefused` for any status but 2xx."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        response = await self._client.request(method, path, json=body, params=query)
        if response.status_code >= 400:
            try:
                detail: Any = response.json()
            except ValueError:
                detail = response.text
            raise APIRefused(response.status_code, detail)
        return response

    async def json(self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        return (await self.request(method, path, body=body, params=params)).json()

    async def aclose(self) -> None:
        await self._client.aclose()


def _path(*parts: str) -> str:
    """An API path of ``parts``, each quoted whole (a run id or step id never adds a path segment)."""
    return "/" + "/".join(quote(part, safe="") for part in parts)


def _event_of(chunk: bytes) -> tuple[int | None, str | None]:
    """The ``id`` and ``event`` of one SSE message of :func:`run_events` (a ping has neither)."""
    pos: int | None = None
    kind: str | None = None
    for line in chunk.decode("utf-8", "replace").splitlines():
        if line.startswith("id: "):
            pos = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
    return pos, kind


class _Shown:
    """The redaction of everything the MCP server shows: the process's secrets as ``***``."""

    def __init__(self) -> None:
        self.secrets = secret_values()

    def __call__(self, value: Any) -> Any:
        return redact(value, self.secrets) if self.secrets else value


def build_mcp_server(api: RunsAPI) -> "MCPServer[Any]":
    """The planweave MCP server: its tools call ``api``. Raises MissingExtra without the ``mcp`` extra."""
    from planweave.extras import require

    try:
        from mcp.server.mcpserver import MCPServer
    except ModuleNotFoundError:
        require("mcp", "the MCP server")
        raise
    calls = _Calls(api)
    with _logging_kept():  # MCPServer configures the root logger (basicConfig): the server keeps its own
        server: MCPServer[Any] = MCPServer(
            "planweave", version=__version__, title="planweave runs",
            instructions="Start planweave runs (a plan document or a goal), follow them (wait_run sends progress "
                         "and returns when the run ends or a step waits for a person), read their steps and "
                         "outputs, approve or reject steps, send human input, cancel runs.",
            middleware=[_redacting(calls.shown)])
    for tool in (*_start_tools(calls), *_read_tools(calls), *_reply_tools(calls)):
        server.add_tool(tool, description=inspect.cleandoc(tool.__doc__ or ""), structured_output=True)
    return server


class _Calls:
    """What the tools share: the API, the redaction, and the SDK's ToolError for a refusal (an isError result)."""

    def __init__(self, api: RunsAPI) -> None:
        from mcp.server.mcpserver.exceptions import ToolError

        self.api = api
        self.shown = _Shown()
        self.error = ToolError

    async def answer(self, method: str, path: str, *, body: Any = None,
                     params: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return await self.api.request(method, path, body=body, params=params)
        except APIRefused as exc:
            raise self.error(self.shown(str(exc))) from None

    async def call(self, method: str, path: str, *, body: Any = None,
                   params: dict[str, Any] | None = None) -> dict[str, Any]:
        shown: dict[str, Any] = self.shown((await self.answer(method, path, body=body, params=params)).json())
        return shown

    async def wait(self, run_id: str, timeout_s: float, ctx: "Context") -> dict[str, Any]:
        async def progress(done: float, total: float | None, message: str) -> None:
            await ctx.report_progress(done, total, self.shown(message))

        try:
            shown: dict[str, Any] = self.shown(await _wait(self.api, run_id, timeout_s, progress))
        except APIRefused as exc:
            raise self.error(self.shown(str(exc))) from None
        return shown

    async def started(self, body: dict[str, Any], wait_s: float, ctx: "Context") -> dict[str, Any]:
        """POST /runs with ``body`` (its None values left out); then, with ``wait_s``, wait as ``wait_run``."""
        accepted = await self.call("POST", "/runs", body={k: v for k, v in body.items() if v is not None})
        return await self.wait(accepted["run_id"], wait_s, ctx) if wait_s > 0 else accepted


def _start_tools(calls: _Calls) -> list[Callable[..., Any]]:
    from mcp.server.mcpserver import Context

    async def start_plan(
        ctx: Context, plan: dict[str, Any] | None = None, plan_yaml: str | None = None, run_id: str | None = None,
        budget_usd: float | None = None, budget_tokens: int | None = None, deadline: float | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """Start running a plan: `plan` (the document as an object: {"steps": [...]}) or `plan_yaml` (its YAML or
        JSON text), as POST /runs. Limits: budget_usd, budget_tokens (its llm steps), deadline (seconds). With
        wait_s > 0, waits up to that long as wait_run does; else returns {run_id, status} at once."""
        return await calls.started(dict(plan=plan, plan_yaml=plan_yaml, run_id=run_id, budget_usd=budget_usd,
                                        budget_tokens=budget_tokens, deadline=deadline), wait_s, ctx)

    async def start_goal(
        goal: str, ctx: Context, model: str | None = None, run_id: str | None = None,
        budget_usd: float | None = None, budget_tokens: int | None = None, deadline: float | None = None,
        max_replans: int | None = None, wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """Plan and run a goal with the server's model (`model`, if given, must name it: `scripted:FILE` for
        offline planning). Limits: budget_usd, budget_tokens, deadline (seconds), max_replans. With wait_s > 0,
        waits up to that long as wait_run does; else returns {run_id, status} at once."""
        served = calls.api.state.model
        if model is not None and (served is None or served.client.model != model):
            now = "no model" if served is None else f"model {served.client.model!r}"
            raise calls.error(calls.shown(f"model {model!r}: this server plans goals with {now}; start it with "
                                          f"`--model {model}` to plan with that one"))
        return await calls.started(dict(goal=goal, run_id=run_id, budget_usd=budget_usd,
                                        budget_tokens=budget_tokens, deadline=deadline, max_replans=max_replans),
                                   wait_s, ctx)

    async def wait_run(run_id: str, ctx: Context, timeout_s: float = 60.0) -> dict[str, Any]:
        """Follow the run until it ends, a step waits for a person, or timeout_s passes (at most 3600), sending
        progress notifications as its steps end; returns get_run's object (timed_out if still working).
        task_status input_required: answer the steps in `questions` with approve_step or send_input, then wait
        again."""
        return await calls.wait(run_id, timeout_s, ctx)

    return [start_plan, start_goal, wait_run]


def _read_tools(calls: _Calls) -> list[Callable[..., Any]]:
    async def get_run(run_id: str, outputs: bool = True) -> dict[str, Any]:
        """The run as GET /runs/{id} shows it: status, steps (status, attempts, durations), waiting steps, cost,
        tokens, answer, root cause and (unless outputs is false) the outputs of its succeeded steps; plus
        task_status (working, input_required, completed, failed, cancelled, interrupted)."""
        report = await calls.call("GET", _path("runs", run_id), params={"outputs": str(outputs).lower()})
        return {**report, "task_status": task_status(report)}

    async def get_step(run_id: str, step: str, full: bool = False) -> dict[str, Any]:
        """One step as GET /runs/{id}/steps/{step}: status, every attempt with its error, rendered args, output
        (above 256 KiB a {truncated, bytes, sha256} marker unless full), error; a waiting step's prompt and
        input_schema."""
        return await calls.call("GET", _path("runs", run_id, "steps", step), params={"full": str(full).lower()})

    async def list_runs(status: list[str] | None = None, since: str | None = None, limit: int = 50,
                        cursor: int | None = None) -> dict[str, Any]:
        """Runs of the journal, newest first (as GET /runs): id, name, status, times, error, step counts, waiting
        steps, tokens, cost. Filter by status (running, interrupted, succeeded, failed, cancelled) and since (30m,
        2h, 7d or an ISO date); page with limit and next_cursor."""
        response = await calls.answer("GET", "/runs", params={
            "status": ",".join(status) if status else None, "since": since, "limit": limit, "cursor": cursor})
        following = response.headers.get("X-Next-Cursor")
        shown: dict[str, Any] = calls.shown({"runs": response.json(),
                                             "next_cursor": int(following) if following else None})
        return shown

    return [get_run, get_step, list_runs]


def _reply_tools(calls: _Calls) -> list[Callable[..., Any]]:
    async def approve_step(run_id: str, step: str, approve: bool = True,
                           reason: str | None = None) -> dict[str, Any]:
        """Approve (the step runs) or reject (it fails, kind rejected) a step waiting for approval. The first
        reply is final: a later one is refused naming the one that stands."""
        body = {"approve": approve, **({"reason": reason} if reason is not None else {})}
        return await calls.call("POST", _path("runs", run_id, "steps", step, "approval"), body=body)

    async def send_input(run_id: str, step: str, value: Any) -> dict[str, Any]:
        """Give the value a human.input step waits for (any JSON value, checked against the step's schema: a
        value it refuses is an error and the step keeps waiting). The first value is final."""
        return await calls.call("POST", _path("runs", run_id, "steps", step, "input"), body={"value": value})

    async def cancel_run(run_id: str, reason: str = "cancelled over MCP") -> dict[str, Any]:
        """Cancel the run: at once if it runs in this server, else through the journal (its process stops it)."""
        return await calls.call("POST", _path("runs", run_id, "cancel"), body={"reason": reason})

    return [approve_step, send_input, cancel_run]


Progress = Callable[[float, float | None, str], Any]


async def _wait(api: RunsAPI, run_id: str, timeout_s: float, progress: Progress) -> dict[str, Any]:
    """The run's report with ``task_status`` once it is no longer ``working``, or when ``timeout_s`` ran out
    (``timed_out``); a progress notification (steps ended, of the plan's) when the wait begins and each time more
    of its steps have ended."""
    if not math.isfinite(timeout_s) or timeout_s < 0:
        raise APIRefused(422, {"detail": f"timeout_s must be a number of seconds from 0 to {MAX_WAIT_S:g}"})
    state = api.state
    sent = -1  # the first report is always sent: the client knows the wait began

    async def report() -> dict[str, Any]:
        nonlocal sent
        shown: dict[str, Any] = await api.json("GET", _path("runs", run_id))
        shown["task_status"] = task_status(shown)
        steps = shown.get("steps") or {}
        ended = sum(1 for s in steps.values() if isinstance(s, dict) and s.get("status") in _STEP_ENDED)
        if ended > sent:  # the spec wants progress to grow with each notification
            sent = ended
            await progress(ended, len(steps) or None, f"{ended} of {len(steps)} steps ended ({shown['status']})")
        return shown

    # The journal position first, then the report: an event stored in between is read again, never missed.
    position = int((await api.request("GET", "/runs", params={"limit": 1})).headers.get("X-Journal-Position", 0))
    current = await report()
    try:
        async with asyncio.timeout(min(timeout_s, MAX_WAIT_S)):
            while current["task_status"] == "working":
                events = run_events(state.engine, state.engine.journal, state.feed, run_id, position, state.timing,
                                    state.stream_limits)
                async with contextlib.aclosing(events):  # type: ignore[type-var]  # an async generator
                    async for chunk in events:
                        pos, kind = _event_of(chunk)
                        position = pos if pos is not None else position
                        if kind in _TURNS or kind == "lagging":
                            break
                current = await report()
    except TimeoutError:
        current = await report()
        current["timed_out"] = current["task_status"] == "working"
    if current["task_status"] == "input_required":
        current["questions"] = [await _question(api, run_id, step, how)
                                for step, how in (current.get("waiting") or {}).items()]
    return current


async def _question(api: RunsAPI, run_id: str, step: str, how: str) -> dict[str, Any]:
    """What a waiting step asks: the prompt, and for input its JSON schema; which tool answers it."""
    detail = await api.json("GET", _path("runs", run_id, "steps", step))
    approval = how == "waiting_approval"
    return {"step": step, "waiting": how, "prompt": detail.get("prompt"),
            "input_schema": None if approval else detail.get("input_schema"),
            "answer_with": "approve_step" if approval else "send_input"}


def _redacting(shown: _Shown) -> Any:
    """Server middleware: every result (the wire form, a dict by then) and JSON-RPC error with the process's
    secrets as ``***``: the SDK's own messages may echo a request's arguments (a tool's argument errors do)."""
    from mcp.shared.exceptions import MCPError

    async def middleware(ctx: Any, call_next: Any) -> Any:
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            message, data = shown(exc.error.message), shown(exc.error.data)
            if (message, data) != (exc.error.message, exc.error.data):
                raise MCPError(exc.error.code, message, data) from None
            raise
        return shown(result) if isinstance(result, dict) else result

    return middleware


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


# -- the streamable HTTP endpoint of `planweave serve` ----------------------------------------------------------
def mount_mcp(app: FastAPI) -> None:
    """Serve ``/mcp`` (MCP over streamable HTTP) on the planweave ``app``, behind the API's bearer token.

    The MCP server and its session manager are built at the first request that carries the token (importing the
    SDK takes half a second that ``serve`` and ``run --watch`` need not wait for) and stopped with the app's
    lifespan. Without the ``mcp`` extra, ``/mcp`` answers 501 saying what to install.
    """
    from planweave.extras import installed

    if not installed("mcp"):
        app.router.add_route(MCP_PATH, _missing_extra, methods=["GET", "POST", "DELETE"], include_in_schema=False)
        return
    endpoint = _Endpoint(app)
    # An ASGI app, not a request handler: Starlette's Route calls it as it is (the SDK mounts its own so).
    app.router.add_route(MCP_PATH, endpoint, methods=["GET", "POST", "DELETE"],  # type: ignore[arg-type]
                         include_in_schema=False)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with inner(application) as value:
            try:
                yield value
            finally:
                await endpoint.close()

    app.router.lifespan_context = lifespan


class _Endpoint:
    """``/mcp``: the token checked (401 without it, as the API), then the SDK's streamable HTTP session manager,
    started at the first such request in a task of its own that :meth:`close` ends."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._manager: Any = None
        self._starting = asyncio.Lock()
        self._stop = asyncio.Event()
        self._held: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: AppState = self.app.state.planweave
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer" or not state.token.matches(credentials.strip()):
            await _send_json(send, 401, {"detail": "missing or wrong access token: send 'Authorization: Bearer "
                                                   "TOKEN' (printed by `planweave serve`)"},
                             [(b"www-authenticate", b"Bearer")])
            return
        manager = await self._started(state)
        await manager.handle_request(scope, receive, send)

    async def _started(self, state: "AppState") -> Any:
        async with self._starting:
            if self._manager is not None:
                return self._manager
            from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
            from mcp.server.transport_security import TransportSecuritySettings

            api = RunsAPI(self.app, state.token.value)
            server = build_mcp_server(api)
            # The bearer token guards the endpoint as it guards the API (a page another site serves cannot know
            # it), and the server may listen on any interface: the SDK's Host-header allow list would refuse those.
            manager = StreamableHTTPSessionManager(
                server._lowlevel_server,  # the SDK's streamable_http_app() wraps it so; mounted, we need the manager
                security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
            running = asyncio.Event()

            async def hold() -> None:  # run() is entered and left in one task, as its task group wants
                try:
                    async with manager.run():
                        running.set()
                        await self._stop.wait()
                finally:
                    await api.aclose()

            self._held = asyncio.create_task(hold(), name="planweave-mcp-sessions")
            started = asyncio.create_task(running.wait())
            await asyncio.wait({self._held, started}, return_when=asyncio.FIRST_COMPLETED)
            started.cancel()
            if not running.is_set():
                await self._held  # it ended before it ran: its error is this request's
            self._manager = manager
            return manager

    async def close(self) -> None:
        """End the MCP sessions (with the app): their requests are cancelled."""
        self._stop.set()
        if self._held is not None:
            await self._held


async def _missing_extra(request: Request) -> JSONResponse:
    return JSONResponse({"detail": "the MCP endpoint needs the 'mcp' extra: pip install 'planweave[mcp]'"}, 501)


async def _send_json(send: Send, status: int, body: dict[str, Any],
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})
