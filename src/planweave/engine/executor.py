"""The execution seam: where a step's tool call runs (in this loop, a worker thread, later a Ray cluster).

The engine decides *what* to call and *when* (the attempt, :mod:`planweave.engine.attempt`); an
:class:`Executor` only performs one call. Its contract, checked for every implementation by
``tests/engine/test_executor_conformance.py``:

- return the tool's output (a JSON value: what ``tool.invoke`` returned);
- let the tool's exception reach the caller as the same exception (``SystemExit`` and ``KeyboardInterrupt``
  included), so the engine classifies a failure the same way whatever ran it;
- stop the call promptly when the awaiting task is cancelled (a timeout, a cancelled run), and raise
  ``CancelledError`` then;
- make ``call.context`` the tool's :func:`~planweave.core.context.current_step`, so what the tool reports
  (heartbeat, progress, usage, a person's input) reaches the run through ``call.context.sink``. The sink is safe to
  call from another thread; a remote executor forwards the reports to it.

Arguments and outputs are canonical JSON values, so a remote executor can ship them as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, NamedTuple, Protocol

from planweave.core.context import StepContext, StepSink, current_step_var
from planweave.core.errors import ToolError
from planweave.core.plan.catalog import ToolSpec


class ToolCall(NamedTuple):
    """One invocation of a tool for a step attempt: the tool, its rendered arguments and the step's context."""

    tool: ToolSpec
    args: Mapping[str, Any]
    context: StepContext

    @property
    def step_id(self) -> str:
        return self.context.step_id

    @property
    def attempt(self) -> int:
        return self.context.attempt

    @property
    def isolation(self) -> str | None:
        """The step's ``isolation`` key (``thread``, ``process`` or None): how a sync Python tool is to run."""
        return self.context.isolation

    @property
    def sink(self) -> StepSink | None:
        """Where the tool's heartbeats, progress and usage go (the run)."""
        return self.context.sink


class Executor(Protocol):
    """Performs a step's tool call (the module docstring states the contract every implementation keeps)."""

    async def execute(self, call: ToolCall) -> Any:
        """Run ``call`` and return the tool's output; raise what the tool raised."""
        ...


def not_on_ray(call: ToolCall) -> ToolError:
    """The error of a step that says ``executor: ray`` given to an executor that runs calls in this process."""
    return ToolError(f"step '{call.step_id}' says executor: ray, but this engine runs tool calls in its own process "
                     "(planweave run --executor ray, or Engine(executor=planweave.executors.ray.RayExecutor()))",
                     kind="arguments", retryable=False)


class InProcessExecutor:
    """The default: the tool runs in the step's own task on the engine's loop."""

    def execute(self, call: ToolCall) -> Coroutine[Any, Any, Any]:
        """``call.tool.invoke(call.args)`` with ``call.context`` as the current step, for the step's task to await.

        A plain function returning the tool's coroutine, not a coroutine awaiting it: one coroutine less per step
        (with the run's task bookkeeping, ~1% of a no-op step's instructions: docs/benchmarks.md, "Where
        planweave's time goes").
        """
        if call.context.executor == "ray":
            raise not_on_ray(call)
        current_step_var.set(call.context)  # the step's task has its own context: this does not leak
        return call.tool.invoke(call.args)


Outcome = tuple[bool, Any]
"""What a worker call ended with: (True, output) or (False, the exception it raised)."""


def _settle(outcome: asyncio.Future[Outcome], result: Outcome) -> None:
    if not outcome.done():
        outcome.set_result(result)


async def _invoke_in_worker(call: ToolCall, home: asyncio.AbstractEventLoop, outcome: asyncio.Future[Outcome]
                            ) -> None:
    """Run the call on the worker loop and hand its outcome to ``home``'s future, whatever it is.

    Every exception is handed over, never raised here: SystemExit or KeyboardInterrupt would stop the worker loop,
    and a CancelledError the tool raised itself would lose its message crossing loops.
    """
    current_step_var.set(call.context)
    result: Outcome
    try:
        result = (True, await call.tool.invoke(call.args))
    except BaseException as exc:  # handed to the awaiting task, which raises it
        result = (False, exc)
    with contextlib.suppress(RuntimeError):  # the engine's loop closed meanwhile
        home.call_soon_threadsafe(_settle, outcome, result)


class ThreadExecutor:
    """Runs every call on one private event loop in a worker thread (the engine's loop stays free).

    Proves the seam for executors that do not share the engine's loop: the tool's reports cross threads through
    the sink, a cancellation is forwarded to the worker's task (and waited for, so the call has ended when the
    step has), and exceptions come back unchanged. Close it with :meth:`aclose` (the engine does so when it
    closes).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _worker_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="planweave-executor", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def execute(self, call: ToolCall) -> Any:
        """Run the call on the worker loop; cancelling the awaiting task cancels the worker's task."""
        if call.context.executor == "ray":
            raise not_on_ray(call)
        outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        handle = asyncio.run_coroutine_threadsafe(_invoke_in_worker(call, asyncio.get_running_loop(), outcome),
                                                  self._worker_loop())
        try:
            ok, value = await asyncio.shield(outcome)
        except asyncio.CancelledError:
            handle.cancel()  # cancels the worker's task, which then settles `outcome`
            await outcome  # a second cancellation of this task stops the wait
            raise
        if ok:
            return value
        raise value

    async def aclose(self) -> None:
        """Stop the worker loop and its thread (calls still running there are abandoned)."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 5.0)
        with contextlib.suppress(RuntimeError):
            loop.close()
