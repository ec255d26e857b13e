"""Steps on Ray: each tool call becomes a Ray task; the engine stays the orchestrator.

Only the invocation crosses. The journal, the scheduler, retries, timeouts, the escalation ladder and redaction stay
in the engine's process (:mod:`planweave.engine.attempt`); :class:`RayExecutor` keeps the contract of
:mod:`planweave.engine.executor` (the same conformance suite runs over it):

- **Tools ship by reference.** A Ray worker imports the tool; nothing is pickled by value. A :class:`ToolRef` says
  where from: the tool's own function (``module:qualname``, a top-level function of an importable module), or a
  toolbox (``module:attr``, a :class:`~planweave.tools.Toolbox` or a function returning one) and the tool's name
  in it: the built-ins' ``http.*`` tools come that way from ``planweave.tools:builtin_tools``. A tool that cannot
  be imported by a worker (a lambda, a closure, a function of ``__main__``, an MCP or ``llm`` tool bound to this
  process) is refused before anything is submitted: the step fails (kind ``arguments``) saying so and suggesting
  ``executor: local``.
- **Reports stream back.** The task is a Ray streaming generator (``num_returns="streaming"``): it yields
  ``("started",)`` when a worker runs it, then the tool's heartbeats, progress and usage as they happen, then the
  outcome; the driver hands each report to the step's sink, so ``current_step()`` works inside the Ray task, and a
  ``heartbeat:`` idle timer sees the beats. That timer starts at ``("started",)`` (:meth:`RayExecutor.reports_start`),
  not when the task is submitted: a task waiting for Ray to schedule it (resources, a cold worker) is not "hung".
  A person's input (``ask``) cannot cross: it fails the step (run such steps with ``executor: local``).
- **Cancellation.** When the awaiting task is cancelled (the attempt's timeout, a cancelled run, the engine
  closing) the Ray task is cancelled with ``ray.cancel`` (recursively: tasks the tool started go too); the
  worker cancels the tool's coroutine, so the tool sees ``CancelledError``. A task still running after
  :attr:`RayExecutor.cancel_grace` seconds is cancelled again with ``force=True`` (its worker process is killed).
- **Resources.** The step's ``resources:`` become the task's Ray request: ``cpu`` → ``num_cpus``, ``gpu`` →
  ``num_gpus``, ``memory`` (MiB) → ``memory`` (bytes), any other name → a custom Ray resource. A step naming no
  ``cpu`` asks for :attr:`RayExecutor.num_cpus` (Ray's own default, 1). The engine's capacities still apply.
- **Outputs come back.** A tool's output returns to the driver and is journaled as any other (resume needs it);
  nothing is left in Ray's object store. Exceptions come back as raised; one that cannot be pickled becomes a
  :class:`~planweave.core.errors.ToolError` naming its type. A worker that dies fails the attempt (kind ``crashed``,
  retryable).
- **Where Ray is.** ``address`` (or ``RAY_ADDRESS``) names a running cluster (``ray start --head``); without one
  ``ray.init`` starts a local Ray for this process. Ray is connected on the first Ray step, and disconnected by
  :meth:`RayExecutor.aclose` (the engine calls it when it closes). Ray is always the wall clock: a virtual clock
  does not reach a Ray worker.

Steps that say ``executor: local`` (or all steps, with ``default="local"``) run with the ``local`` executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import queue
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from planweave.core.clock import RealClock
from planweave.core.context import StepContext, current_step_var
from planweave.core.errors import PlanweaveError, ToolError
from planweave.core.plan.catalog import ToolSpec
from planweave.engine.executor import Executor, InProcessExecutor, ToolCall
from planweave.extras import require
from planweave.tools import Tool, Toolbox

BUILTIN_TOOLBOX = "planweave.tools:builtin_tools"
"""The toolbox reference the built-in tools that are closures (``http.*``) ship by."""

MIB = 1 << 20
CANCEL_POLL_S = 0.05
"""How often the worker's task body looks up from waiting for the tool: Ray cancels a task by interrupting the
worker's main thread (``interrupt_main``), which takes effect only between bytecodes, never inside a blocking wait."""


class RayUnavailable(PlanweaveError):
    """Ray could not be started or reached (the message says where and why)."""


class ToolRef(NamedTuple):
    """Where a Ray worker imports a tool from: ``function`` (``module:qualname`` of the tool's function) or
    ``toolbox`` (``module:attr`` of a Toolbox or of a function returning one) and the tool's ``name`` there."""

    kind: Literal["function", "toolbox"]
    target: str
    name: str
    idempotent: bool = False


class StepIdentity(NamedTuple):
    """What the worker needs to rebuild the step's :class:`~planweave.core.context.StepContext`."""

    run_id: str
    step_id: str
    attempt: int
    isolation: str | None
    resources: Mapping[str, int]


# -- references (driver side) -------------------------------------------------------------------------------------
def _resolve(target: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the attribute."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _toolbox(target: str) -> Mapping[str, Tool]:
    """The toolbox ``module:attr`` names: the attribute itself, or what calling it returns."""
    obj = _resolve(target)
    if not isinstance(obj, Toolbox) and callable(obj):
        obj = obj()
    if not isinstance(obj, Mapping):
        raise TypeError(f"'{target}' is not a Toolbox (nor a function returning one)")
    return obj


def _same_function(a: Any, b: Any) -> bool:
    return bool(getattr(a, "__module__", None) == getattr(b, "__module__", None)
                and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None))


def tool_reference(tool: ToolSpec, toolboxes: Sequence[str] = (BUILTIN_TOOLBOX,)) -> ToolRef:
    """How a Ray worker can import ``tool``; raise :class:`~planweave.core.errors.ToolError` (kind ``arguments``,
    not retryable) naming the tool and why when it cannot.

    Its own function comes first (a top-level function of an importable module, or a :class:`Tool` defined there);
    then each of ``toolboxes`` (``module:attr``) holding a tool of that name made from the same function.
    """
    if type(tool) is not Tool:  # a subclass keeps state of its own (a jailed shell's policy): it stays here
        raise ToolError(f"tool '{tool.name}' cannot run on Ray: it is a {type(tool).__name__} bound to this process "
                        "(only plain Python tools ship, by reference); give the step executor: local",
                        kind="arguments", retryable=False)
    fn = tool.fn
    module, qualname = getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", repr(fn))
    where = f"{module}.{qualname}"
    if module != "__main__" and "<" not in qualname:
        with contextlib.suppress(Exception):
            found = _resolve(f"{module}:{qualname}")
            if found is fn or (isinstance(found, Tool) and found.fn is fn):
                return ToolRef("function", f"{module}:{qualname}", tool.name, tool.idempotent)
    for target in toolboxes:
        with contextlib.suppress(Exception):
            other = _toolbox(target).get(tool.name)
            if other is not None and _same_function(other.fn, fn):
                return ToolRef("toolbox", target, tool.name, tool.idempotent)
    raise ToolError(f"tool '{tool.name}' cannot run on Ray: a Ray worker cannot import its function {where} (a "
                    "lambda, a closure or a function of __main__); define it at the top level of an importable "
                    "module, or give the step executor: local", kind="arguments", retryable=False)


def ray_options(resources: Mapping[str, int], num_cpus: float) -> dict[str, Any]:
    """The Ray task options for a step's ``resources`` (see the module docstring)."""
    options: dict[str, Any] = {"num_cpus": num_cpus}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        if name == "cpu":
            options["num_cpus"] = amount
        elif name == "gpu":
            options["num_gpus"] = amount
        elif name == "memory":
            options["memory"] = amount * MIB
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


# -- the Ray task (worker side) -----------------------------------------------------------------------------------
Report = tuple[Any, ...]
"""What the task yields: ("started",) first, ("heartbeat",), ("progress", fraction, message), ("usage", usage), then
("ok", output) or ("raise", exception)."""

_worker_tools: dict[ToolRef, Tool] = {}
_worker_loop: asyncio.AbstractEventLoop | None = None
_worker_lock = threading.Lock()


def _tool_in_worker(ref: ToolRef) -> Tool:
    tool = _worker_tools.get(ref)
    if tool is None:
        if ref.kind == "toolbox":
            tool = _toolbox(ref.target)[ref.name]
        else:
            found = _resolve(ref.target)
            fn = found.fn if isinstance(found, Tool) else found
            tool = Tool.from_function(fn, name=ref.name, idempotent=ref.idempotent)
        _worker_tools[ref] = tool
    return tool


def _loop_in_worker() -> asyncio.AbstractEventLoop:
    """One event loop per worker process, in a daemon thread: tools keep what they open (pools) between calls."""
    global _worker_loop
    with _worker_lock:
        if _worker_loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="planweave-ray-tools", daemon=True).start()
            _worker_loop = loop
        return _worker_loop


class _ReportQueue:
    """The worker-side sink: the tool's reports go onto a queue the task body yields from."""

    def __init__(self, reports: queue.SimpleQueue[Report]) -> None:
        self._reports = reports

    def step_usage(self, step_id: str, usage: Mapping[str, Any]) -> None:
        self._reports.put(("usage", dict(usage)))

    def step_heartbeat(self, step_id: str) -> None:
        self._reports.put(("heartbeat",))

    def step_progress(self, step_id: str, fraction: float | None, message: str) -> None:
        self._reports.put(("progress", fraction, message))

    async def step_input(self, step_id: str, prompt: str, schema: Mapping[str, Any] | None) -> Any:
        raise ToolError(f"step '{step_id}' runs on Ray and cannot ask a person for input; give it executor: local",
                        kind="arguments", retryable=False)


def _sendable(outcome: Report, tool: str) -> Report:
    """``outcome`` if it pickles, else the ToolError saying what could not be sent back."""
    pickler: Any = importlib.import_module("ray.cloudpickle")  # what Ray pickles with (untyped)
    try:
        sent = pickler.dumps(outcome)
        if outcome[0] == "raise":
            pickler.loads(sent)  # an exception whose __init__ takes other arguments pickles, then fails here
        return outcome
    except Exception as exc:
        if outcome[0] == "ok":
            return ("raise", ToolError(f"tool '{tool}' ran on Ray, but its output cannot be sent back: "
                                       f"{type(exc).__name__}: {exc}", kind="output", retryable=False))
        raised = outcome[1]
        return ("raise", ToolError(f"tool '{tool}' raised {type(raised).__name__}: {raised} (on Ray; the exception "
                                   "cannot be sent back)"))


async def _invoke(ref: ToolRef, args: dict[str, Any], context: StepContext,
                  reports: queue.SimpleQueue[Report], ended: threading.Event) -> None:
    current_step_var.set(context)
    outcome: Report
    try:
        outcome = ("ok", await _tool_in_worker(ref).invoke(args))
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # cancelled by the task body: nobody waits for an outcome
        outcome = ("raise", exc)  # the tool raised it itself
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the driver raises them as the tool did
        outcome = ("raise", exc)
    finally:
        ended.set()
    reports.put(_sendable(outcome, ref.name))


def run_step(ref: ToolRef, args: dict[str, Any], step: StepIdentity) -> Iterator[Report]:
    """The Ray task body: call the tool on the worker's loop, yield its reports as they come, then its outcome.

    A cancellation (``ray.cancel``: a KeyboardInterrupt here, or only the task marked cancelled when the interrupt
    lands in Ray's own code between two reports) cancels the tool's coroutine and waits a moment for it to end, so
    the tool sees ``CancelledError`` as it would in the engine's process.
    """
    import ray

    runtime = ray.get_runtime_context()
    reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
    context = StepContext(step.run_id, step.step_id, step.attempt, RealClock(), _ReportQueue(reports),
                          step.isolation, "ray", step.resources)
    ended = threading.Event()
    future = asyncio.run_coroutine_threadsafe(_invoke(ref, args, context, reports, ended), _loop_in_worker())
    try:
        yield ("started",)
        while True:
            try:
                report = reports.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                if runtime.is_canceled():
                    raise KeyboardInterrupt from None
                continue
            yield report
            if report[0] in ("ok", "raise"):
                return
    except BaseException:  # KeyboardInterrupt from ray.cancel, or the generator closed
        future.cancel()  # marks the future cancelled at once; the tool's task ends when it has handled it
        ended.wait(timeout=1.0)
        raise


# -- the executor (driver side) -----------------------------------------------------------------------------------
class RayExecutor:
    """Runs step attempts as Ray tasks (see the module docstring); ``executor: local`` steps run with ``local``.

    ``address``: a cluster (``host:port``, ``auto``, ``ray://...``); None uses ``RAY_ADDRESS``, or starts a local
    Ray. ``default``: where steps that do not say go. ``toolboxes``: ``module:attr`` references tools may ship by
    (besides their own functions). ``num_cpus``: what a step asks of Ray when its ``resources`` name no ``cpu``.
    ``init_options``: more keyword arguments for ``ray.init``.
    """

    def __init__(self, address: str | None = None, *, default: Literal["ray", "local"] = "ray",
                 local: Executor | None = None, toolboxes: Sequence[str] = (), num_cpus: float = 1.0,
                 cancel_grace: float = 2.0, init_options: Mapping[str, Any] | None = None) -> None:
        require("ray", "the Ray executor")
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.default = default
        self.local: Executor = local or InProcessExecutor()
        self.toolboxes = (*toolboxes, BUILTIN_TOOLBOX)
        self.num_cpus = num_cpus
        self.cancel_grace = cancel_grace
        self._init_options = dict(init_options or {})
        self._refs: dict[int, tuple[ToolSpec, ToolRef]] = {}
        self._task: Any = None
        self._submitters: dict[tuple[tuple[str, int], ...], Any] = {}
        self._ray: Any = None
        self._connected_here = False
        self._connecting = asyncio.Lock()

    def runs_on_ray(self, call: ToolCall) -> bool:
        """Whether ``call`` goes to Ray: its step says ``executor: ray``, or says nothing and the default is Ray."""
        return (call.context.executor or self.default) == "ray"

    def reports_start(self, call: ToolCall) -> bool:
        """Whether ``call`` beats once when it starts (a Ray task): the engine arms its heartbeat timer then."""
        return self.runs_on_ray(call)

    def reference(self, tool: ToolSpec) -> ToolRef:
        """``tool``'s :class:`ToolRef` (found once per tool object), or the ToolError refusing it."""
        known = self._refs.get(id(tool))
        if known is not None and known[0] is tool:
            return known[1]
        ref = tool_reference(tool, self.toolboxes)
        self._refs[id(tool)] = (tool, ref)
        return ref

    async def connect(self) -> None:
        """Connect to Ray now (``ray.init`` in a thread: it blocks); raise :class:`RayUnavailable` if it fails."""
        async with self._connecting:
            if self._task is None:
                await asyncio.to_thread(self._connect)

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            _check_reachable(self.address)
            options: dict[str, Any] = {"logging_level": logging.ERROR, "configure_logging": False}
            options.update(self._init_options)
            # Connected from a thread, Ray warns that it leaves SIGTERM alone: as it should (the CLI owns SIGTERM).
            worker_log = logging.getLogger("ray._private.worker")
            level = worker_log.level
            worker_log.setLevel(logging.ERROR)
            try:
                ray.init(address=self.address, **options)
            except Exception as exc:  # Ray raises many kinds; all mean "not reachable from here"
                where = f"at {self.address}" if self.address else "(a local Ray)"
                raise RayUnavailable(f"cannot connect to Ray {where}: {type(exc).__name__}: {exc}") from None
            finally:
                worker_log.setLevel(level)
            self._connected_here = True
        self._ray = ray
        self._task = ray.remote(num_returns="streaming", max_retries=0)(run_step)

    async def execute(self, call: ToolCall) -> Any:
        """Run ``call`` as a Ray task (or with ``local``); forward its reports to the step's sink; return the output."""
        if not self.runs_on_ray(call):
            return await self.local.execute(call)
        ref = self.reference(call.tool)
        if self._task is None:
            await self.connect()
        context = call.context
        step = StepIdentity(context.run_id, context.step_id, context.attempt, context.isolation,
                            dict(context.resources))
        generator = self._submitter(context.resources).remote(ref, dict(call.args), step)
        try:
            kind, value = await self._outcome(generator, call)
        except asyncio.CancelledError:
            await self._cancel(generator)
            raise
        if kind == "ok":
            return value
        raise value

    def _submitter(self, resources: Mapping[str, int]) -> Any:
        """The Ray task with the options for ``resources`` (one per distinct claim: ``options`` is not free)."""
        key = tuple(sorted(resources.items()))
        submitter = self._submitters.get(key)
        if submitter is None:
            submitter = self._submitters[key] = self._task.options(**ray_options(resources, self.num_cpus))
        return submitter

    async def _outcome(self, generator: Any, call: ToolCall) -> Report:
        """The task's outcome report; its heartbeats, progress and usage are handed to the sink on the way."""
        sink, sid = call.context.sink, call.step_id
        ray = self._ray
        try:
            async for item in generator:
                report: Report = await item
                kind = report[0]
                if kind in ("ok", "raise"):
                    return report
                if sink is None:
                    continue
                if kind in ("heartbeat", "started"):
                    sink.step_heartbeat(sid)
                elif kind == "progress":
                    sink.step_progress(sid, report[1], report[2])
                elif kind == "usage":
                    sink.step_usage(sid, report[1])
        except ray.exceptions.RayError as exc:
            raise ToolError(f"the Ray task of step '{sid}' failed: {type(exc).__name__}: {_first_line(exc)}",
                            kind="crashed") from None
        raise ToolError(f"the Ray task of step '{sid}' ended without an outcome", kind="crashed")

    async def _cancel(self, generator: Any) -> None:
        """Cancel the Ray task and wait (a bounded time) for it to end; force it if it does not."""
        ray = self._ray
        ray.cancel(generator, force=False, recursive=True)
        try:
            async with asyncio.timeout(self.cancel_grace):
                await _drain(generator)
        except TimeoutError:
            with contextlib.suppress(Exception):
                ray.cancel(generator, force=True, recursive=True)

    async def aclose(self) -> None:
        """Disconnect from Ray if this executor connected (a local Ray it started stops); close ``local``."""
        closer = getattr(self.local, "aclose", None)
        if closer is not None:
            await closer()
        if self._connected_here and self._ray is not None:
            await asyncio.to_thread(self._ray.shutdown)
        self._connected_here = False
        self._task = self._ray = None
        self._submitters.clear()


async def _drain(generator: Any) -> None:
    """Wait for a cancelled task's generator to end, whatever it ends with."""
    with contextlib.suppress(Exception):
        async for item in generator:
            with contextlib.suppress(Exception):
                await item


CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str | None) -> None:
    """Refuse at once a ``host:port`` nothing answers on (``ray.init`` would retry for a minute)."""
    if not address or address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RayUnavailable(f"--ray-address {address!r}: expected HOST:PORT (as `ray start --head` prints it)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnavailable(f"cannot connect to Ray at {address}: nothing answers there ({exc.strerror or exc}); "
                             "start a cluster with `ray start --head`, or leave the address out to start a local "
                             "Ray") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
