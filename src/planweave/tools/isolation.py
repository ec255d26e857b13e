"""Where a sync tool call runs: a daemon thread of planweave's own executor, or (``isolation: process``) a worker
process that is killed when the step times out or is cancelled.

A thread cannot be stopped from outside. Run in the loop's default executor, a sync call that ignores its timeout
kept ``asyncio.run`` (which joins that executor) and the interpreter (which joins non-daemon threads) alive until
the call returned. Here the workers are daemon threads: the step ends at its timeout, the process can exit at once,
and a call still running then dies with it. A call that must really stop at its timeout runs in a process.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import pickle
import queue
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from planweave.core.errors import ToolError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

P = ParamSpec("P")
T = TypeVar("T")

MAX_TOOL_THREADS = 256
"""Most sync tool calls running at once in threads; more wait for a free worker. A call that outlives its step's
timeout keeps its worker busy until it returns, so this is well above the engine's default concurrency (64)."""


@dataclass
class _Call:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # cancelled while queued: it never starts
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # SystemExit too: it would end the worker silently; the caller sees it
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class ToolThreads(ThreadPoolExecutor):
    """A thread pool of daemon workers: a call that never returns cannot keep the process alive at exit.

    Workers are started on demand (up to ``max_workers``) and reused. :meth:`shutdown` never waits for running calls
    (they cannot be interrupted, so a wait could be forever): it refuses new calls and lets idle workers end.
    A ``ThreadPoolExecutor`` only by type (``loop.set_default_executor`` insists on one): none of its workers,
    which are joined at exit, are ever started.
    """

    def __init__(self, max_workers: int = MAX_TOOL_THREADS, *, name: str = "planweave-tool") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=name)
        self._max_workers = max_workers
        self._name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a worker each time it is about to wait for a call
        self._lock = threading.Lock()
        self._workers = 0
        self._closed = False

    @property
    def workers(self) -> int:
        """How many worker threads have been started."""
        return self._workers

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)`` in a worker thread; return its future."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: cannot run new calls after shutdown")
            self._calls.put(_Call(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and self._workers < self._max_workers:
                self._workers += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._workers}", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and end idle workers; running calls go on (``wait`` is ignored: see the class)."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                self._drain()
            for _ in range(self._workers):
                self._calls.put(None)

    def _drain(self) -> None:
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            if call is not None:
                call.future.cancel()

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            call.run()
            del call  # do not keep the last result alive while idle
            self._idle.release()


_tool_threads = ToolThreads()


def tool_threads() -> ToolThreads:
    """The process-wide executor of sync tool calls."""
    return _tool_threads


async def run_in_thread(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Call the sync ``fn(**kwargs)`` in a daemon worker thread, with the caller's context variables.

    Cancelling the caller (a timeout, a cancelled run) stops the wait at once; the call itself runs on until it
    returns, without keeping the process alive. Use ``isolation: process`` for calls that must really stop.
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, **kwargs)
    return await loop.run_in_executor(_tool_threads, call)


# -- isolation: process ------------------------------------------------------------------------------------------
STOP_GRACE_S = 0.5
"""How long a worker process has to end after SIGTERM before it gets SIGKILL."""

_Outcome = tuple[str, Any]  # ("ok", value) | ("raise", exception) | ("unsendable", description)


async def run_in_process(fn: Callable[..., Any], kwargs: Mapping[str, Any], *, tool: str) -> Any:
    """Call the sync ``fn(**kwargs)`` in a new worker process (multiprocessing ``spawn``); return its result.

    The process is stopped (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`) and reaped when the caller is
    cancelled (a step timeout, a cancelled run, the engine closing); it never outlives the call. ``fn`` must be
    importable by module and name in a fresh interpreter (a top-level function of an importable module) and its
    arguments and result picklable: otherwise the call fails with a :class:`ToolError` saying so. An exception the
    call raises is raised here. Tools in a process cannot report heartbeats or progress.
    """
    import multiprocessing  # only isolation: process steps need it (~4 ms of every start-up otherwise)

    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    proc = context.Process(target=_child, args=(sender, fn, dict(kwargs)), name=f"planweave-{tool}", daemon=False)
    try:
        proc.start()
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        receiver.close()
        where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        raise ToolError(
            f"tool '{tool}' cannot run with isolation: process: its function {where} and arguments must be "
            f"picklable, the function importable by module and name (a top-level function): {exc}",
            kind="arguments", retryable=False) from None
    finally:
        sender.close()  # the child has its own end: its death is an end of file here
    ended = False
    try:
        outcome = await run_in_thread(_receive, conn=receiver)
        ended = True
    finally:
        await _stop(proc, ended)
    return _result(outcome, proc, tool, fn)


def _child(conn: Connection, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """The worker process: call ``fn``, send back what happened. Ctrl-C is the parent's business."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    outcome: _Outcome
    try:
        outcome = ("ok", fn(**kwargs))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the parent's step fails with them
        outcome = ("raise", exc)
    try:
        conn.send(outcome)
    except Exception as exc:  # an unpicklable result or exception
        what = "result" if outcome[0] == "ok" else f"exception ({type(outcome[1]).__name__}: {outcome[1]})"
        conn.send(("unsendable", f"its {what} cannot be pickled: {type(exc).__name__}: {exc}"))
    conn.close()


def _receive(conn: Connection) -> _Outcome | None:
    """Wait for the worker's message (None if it died first); the connection is closed here, in its thread."""
    try:
        message: _Outcome = conn.recv()
        return message
    except (EOFError, OSError):
        return None
    finally:
        conn.close()


async def _stop(proc: BaseProcess, ended: bool) -> None:
    """Make sure the worker is gone and reaped (a zombie still has its pid); ask it to stop if it is working."""
    if not ended:
        proc.terminate()
    try:
        await run_in_thread(_reap, proc=proc)
    except asyncio.CancelledError:  # cancelled again while reaping: no more grace
        proc.kill()
        proc.join(STOP_GRACE_S)
        raise


def _reap(proc: BaseProcess) -> None:
    proc.join(STOP_GRACE_S)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


def _result(outcome: _Outcome | None, proc: BaseProcess, tool: str, fn: Callable[..., Any]) -> Any:
    if outcome is None:
        module = getattr(fn, "__module__", "?")
        raise ToolError(f"the worker process of tool '{tool}' ended (exit code {proc.exitcode}) without a result "
                        f"(did it crash, or fail to import {module}?)", kind="crashed")
    status, value = outcome
    if status == "ok":
        return value
    if status == "raise":
        raise value
    raise ToolError(f"tool '{tool}' ran in a worker process, but {value}", kind="output", retryable=False)
