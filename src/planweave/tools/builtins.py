"""The built-in tools every plan file can use: noop, sleep, shell, http.get, http.post, python."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import os
import signal
import weakref
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from planweave.core.context import current_step
from planweave.core.errors import ToolError
from planweave.core.plan.model import MAX_SECONDS
from planweave.tools.isolation import run_in_thread
from planweave.tools.registry import Tool, Toolbox

if TYPE_CHECKING:  # httpx is imported on the first request: ~70 ms of every CLI start otherwise
    import httpx

OUTPUT_LIMIT = 1_000_000  # characters of stdout/stderr/body kept; the rest is cut (and said so)
FAILED_STREAM_CHARS = 4_000  # of a failed program's stdout and stderr kept in its step's error: the end of each


def _cap(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[:OUTPUT_LIMIT] + f"\n[... {len(text) - OUTPUT_LIMIT} more characters cut]"


async def noop(**kwargs: Any) -> dict[str, Any]:
    """Return the arguments unchanged."""
    return kwargs


def _duration(seconds: float) -> float:
    """A finite number of seconds in [0, MAX_SECONDS], the plan's own bound on durations (NaN and Infinity too)."""
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
        raise PydanticCustomError(
            "duration", f"must be a finite number of seconds, at least 0 and at most {MAX_SECONDS:g} (about 31 years), "
            f"got {seconds}")
    return seconds


Seconds = Annotated[float, AfterValidator(_duration)]


async def sleep(seconds: Seconds, result: Any = None) -> Any:
    """Wait ``seconds`` on the engine's clock (virtual or real), then return ``result`` (or the seconds waited)."""
    await asyncio.sleep(seconds)
    return {"slept": seconds} if result is None else result


async def shell(
    argv: list[str],
    cwd: str | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """Run a program (argv list, no shell interpretation); return exit_code, stdout and stderr.

    With ``check`` (default) a non-zero exit fails the step (kind ``exit_code``). ``env`` adds to the inherited
    environment. On timeout or cancellation the whole process group is killed.
    """
    return await run_program(argv, cwd=cwd, timeout=timeout, env=env, input=input, check=check)


async def run_program(
    argv: list[str],
    *,
    executable: str | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """Run ``argv`` like the ``shell`` tool; with ``executable``, that file runs (``argv[0]`` is only its name).

    The confined shell passes the absolute path it checked, so no ``PATH`` or cwd can change what runs.
    """
    if not argv:
        raise ToolError("argv must name a program", kind="arguments", retryable=False)
    full_env = {**os.environ, **env} if env else None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            executable=executable,
            cwd=cwd,
            env=full_env,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise ToolError(f"cannot run {argv[0]!r}: {exc.strerror or exc}", kind="arguments", retryable=False) from None
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input.encode() if input is not None else None)
    except BaseException:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        raise
    stdout, stderr = _cap(out.decode(errors="replace")), _cap(err.decode(errors="replace"))
    result = {"exit_code": proc.returncode, "stdout": stdout, "stderr": stderr}
    if check and proc.returncode != 0:
        tail = stderr.strip().splitlines()[-3:]
        raise ToolError(
            f"{argv[0]} exited with code {proc.returncode}" + (": " + " | ".join(tail) if tail else "")
            + _streams_kept(stdout, stderr),
            kind="exit_code",
        )
    return result


def _streams_kept(stdout: str, stderr: str) -> str:
    """What a failed program printed, below the error's first line (the summary tables show): the last
    :data:`FAILED_STREAM_CHARS` of its stdout and of its stderr, each under a heading (nothing for an empty one)."""
    kept = ""
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        text = text.rstrip("\n")
        if not text.strip():
            continue
        cut = len(text) - FAILED_STREAM_CHARS
        if cut > 0:
            kept += f"\n{name} (the last {FAILED_STREAM_CHARS:,} of {len(text):,} characters):\n{text[cut:]}"
        else:
            kept += f"\n{name}:\n{text}"
    return kept


def _response(resp: httpx.Response) -> dict[str, Any]:
    out: dict[str, Any] = {"status": resp.status_code, "headers": dict(resp.headers), "text": _cap(resp.text)}
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            out["json"] = resp.json()
        except ValueError:
            pass
    return out


HTTP_MAX_CONNECTIONS = 64
"""Most connections the ``http.*`` tools of one toolbox keep open at once (all hosts together)."""


class HttpPool:
    """The one ``httpx.AsyncClient`` that the ``http.*`` tools of a toolbox share: connections are kept alive and
    reused across steps, and at most ``max_connections`` are open at once (more requests wait for a free one).

    The client is made on first use in the running event loop; a use from another loop (a new ``asyncio.run``)
    makes a new one, since a client cannot move between loops. :meth:`aclose` closes it (the engine closes its
    toolbox when it closes); a later request opens a new one.
    """

    def __init__(self, max_connections: int = HTTP_MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError(f"http_max_connections must be at least 1, got {max_connections}")
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> httpx.AsyncClient:
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            limits = httpx.Limits(max_connections=self._max_connections,
                                  max_keepalive_connections=self._max_connections)
            self._client = httpx.AsyncClient(limits=limits, follow_redirects=True)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the connections (only a client of the running loop can be closed; others died with theirs)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    async def request(self, method: str, url: str, raise_for_status: bool, timeout: float,
                      **kw: Any) -> dict[str, Any]:
        """Send one request; ``timeout`` bounds connecting, writing and each read, not the wait for a free
        connection of the pool (that is the engine's concurrency at work, and the step's ``timeout`` bounds it)."""
        import httpx

        try:
            resp = await self._current().request(method, url, timeout=httpx.Timeout(timeout, pool=None), **kw)
        except httpx.TimeoutException as exc:
            raise ToolError(f"{method} {url}: timed out ({exc.__class__.__name__})", kind="timeout") from None
        except httpx.HTTPError as exc:
            raise ToolError(f"{method} {url}: {exc.__class__.__name__}: {exc}", kind="ConnectionError") from None
        if raise_for_status and resp.status_code >= 400:
            retryable = resp.status_code in (408, 425, 429) or resp.status_code >= 500
            raise ToolError(f"{method} {url}: HTTP {resp.status_code}", kind=f"http_{resp.status_code}",
                            retryable=retryable)
        return _response(resp)


def http_tools(pool: HttpPool) -> tuple[Tool, Tool]:
    """The ``http.get`` and ``http.post`` tools, sending through ``pool``."""

    async def http_get(
        url: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        raise_for_status: bool = True,
    ) -> dict[str, Any]:
        """HTTP GET; returns status, headers, text and (for JSON responses) json. 4xx/5xx fail the step."""
        return await pool.request("GET", url, raise_for_status, timeout, params=params, headers=headers)

    async def http_post(
        url: str,
        json: Any = None,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        raise_for_status: bool = True,
    ) -> dict[str, Any]:
        """HTTP POST of a JSON body (``json``) or a form (``data``); returns like http.get."""
        return await pool.request("POST", url, raise_for_status, timeout, json=json, data=data, headers=headers)

    _BUILTIN_FUNCTIONS.update((http_get, http_post))
    return (Tool.from_function(http_get, name="http.get", idempotent=True),
            Tool.from_function(http_post, name="http.post"))


async def human_input(prompt: str, schema: dict[str, Any] | None = None) -> Any:
    """Ask a person for a value and wait for it; the value (checked against the JSON ``schema``) is the output.

    The step shows as ``waiting_input`` until ``planweave send RUN STEP --value JSON`` (or ``Run.send``) gives a
    value; a value that fails ``schema`` is refused and the step keeps waiting. The step's ``timeout`` bounds the
    wait. Outside a run there is nobody to ask: the call fails.
    """
    if schema is not None:
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ToolError(f"schema is not a valid JSON schema: {exc.message}", kind="arguments",
                            retryable=False) from None
    try:
        step = current_step()
    except LookupError:
        raise ToolError("human.input can only wait for a person inside a run", kind="arguments",
                        retryable=False) from None
    return await step.ask(prompt, schema)


async def python(function: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Call ``module:attr`` with keyword arguments ``kwargs``; sync functions run in a worker thread."""
    module_name, _, attr = function.partition(":")
    if not module_name or not attr:
        raise ToolError(f"function must look like 'module:attr', got {function!r}", kind="arguments", retryable=False)
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ToolError(f"cannot import {function!r}: {exc}", kind="arguments", retryable=False) from None
    if isinstance(target, Tool):
        return await target.invoke(kwargs or {})
    if not callable(target):
        raise ToolError(f"{function!r} is not callable", kind="arguments", retryable=False)
    if inspect.iscoroutinefunction(target):
        return await target(**(kwargs or {}))
    return await run_in_thread(target, **(kwargs or {}))


# The functions behind the built-in tools (the http.* ones are made per pool): a toolbox built from
# builtin_tools() and merged with another toolbox's built-ins is the same tools twice, not a clash.
_BUILTIN_FUNCTIONS: weakref.WeakSet[Any] = weakref.WeakSet()


def is_builtin(t: Tool) -> bool:
    """Whether ``t`` is one of the built-in tools (of any :func:`builtin_tools` toolbox, confined or not)."""
    return t.fn in _BUILTIN_FUNCTIONS


def builtin_tools(*, http_max_connections: int = HTTP_MAX_CONNECTIONS) -> Toolbox:
    """A toolbox with the built-in tools; its ``http.*`` tools share one pool of ``http_max_connections``."""
    pool = HttpPool(http_max_connections)
    box = Toolbox()
    box.on_close(pool.aclose)
    box.add(noop, idempotent=True)
    box.add(sleep, idempotent=True)
    box.add(shell)
    for http_tool in http_tools(pool):
        box.add(http_tool)
    box.add(python)
    box.add(human_input, name="human.input", idempotent=True)  # waiting has no effect: a resume asks again
    _BUILTIN_FUNCTIONS.update(t.fn for t in box.values())
    return box
