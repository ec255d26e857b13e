"""Running one ``run`` or ``resume``: the journal and engine opened, the run shown live, interrupts turned
into a resumable stop, and how it ended printed."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager, nullcontext, redirect_stdout
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, TextIO, TypeVar

from rich.console import Console
from rich.text import Text

from planweave.cli import views
from planweave.cli.common import (
    ExitCode,
    journal_flag,
    open_mcp,
    print_json,
    shown_redaction,
)
from planweave.cli.executor_flags import NO_EXECUTOR_FLAGS, ExecutorFlags
from planweave.core.clock import Clock, RealClock, VirtualClock, run_virtual
from planweave.core.state import RunState
from planweave.engine.runtime import (
    Engine,
    Run,
    RunResult,
)
from planweave.extras import require
from planweave.journal import Journal, default_journal_url, open_journal, redact_url
from planweave.runview import run_report
from planweave.tools import Toolbox
from planweave.tools.isolation import ToolThreads
from planweave.tools.safety import SecretRedactor

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """The concurrency and capacities an engine is opened with."""

    concurrency: int | None
    capacities: Mapping[str, int]


@dataclass(frozen=True)
class Session:
    """Where and how a ``run`` or ``resume`` command executes."""

    journal_url: str
    tools: Toolbox
    tool_flags: tuple[str, ...]
    virtual: bool
    json_output: bool
    mcp_flags: tuple[str, ...] = ()
    watch_port: int | None = None  # serve the dashboard for this run (``--watch``)
    all_rows: bool = False  # the final view shows every step (``--all``), not the summary
    executor: ExecutorFlags = NO_EXECUTOR_FLAGS  # ``--executor``, ``--ray-address``
    cache: bool = True  # ``--no-cache``: no step reuses a cached output (docs/caching.md)
    # What else a resume must be given, the journal not keeping it: the jail (--workdir, --allow-exec), the --config
    # arguments (the executor, cache, the rest of the jail...), a goal run's --base-url and --ask-human (its model
    # it reads from the journal).
    resume_flags: tuple[str, ...] = ()

    def resume_command(self, run_id: str) -> str:
        """The command that continues ``run_id`` as it ran, as printed: the same journal (its password as
        ``***``), tools, jail, executor and, for a --goal run, endpoint (never a key: that stays in the
        environment)."""
        parts = ["planweave", "resume", run_id]
        if self.journal_url != default_journal_url():
            parts += ["--journal", redact_url(self.journal_url)]
        for flag in self.tool_flags:
            parts += ["--tools", flag]
        for flag in self.mcp_flags:
            parts += ["--mcp", flag]
        parts += self.resume_flags
        return " ".join(shlex.quote(part) for part in parts)


@dataclass(frozen=True)
class Outcome:
    """How a ``run`` or ``resume`` command ended: ``status`` is succeeded, failed, cancelled or interrupted."""

    run_id: str | None
    status: str
    error: str | None
    report: Mapping[str, Any]
    state: RunState | None
    durable: bool
    reported: bool = False  # already printed when the run ended (``--watch`` kept serving after it)

    @property
    def exit_code(self) -> ExitCode:
        if self.status == "succeeded":
            return ExitCode.SUCCEEDED
        if self.status == "interrupted":
            return ExitCode.INTERRUPTED
        return ExitCode.FAILED


class _InterruptSignals:
    """Turns the first SIGINT/SIGTERM into a cancellation of the main task; a second one exits immediately.

    Cancelling the main task unwinds the engine's context, which interrupts (not cancels) its runs: the journal
    keeps them resumable. Once the run is over (``disarm``) a first signal is ignored so the journal closes cleanly;
    while :meth:`wait` waits (``--watch`` serving the dashboard of a run that ended) it ends that wait instead.
    """

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._loop = task.get_loop()
        self._armed = True
        self._received = 0
        self._installed: list[signal.Signals] = []
        self._waiter: asyncio.Future[None] | None = None
        self.fired = False

    def __enter__(self) -> _InterruptSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._loop.add_signal_handler(sig, self._on_signal)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                continue
            self._installed.append(sig)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig in self._installed:
            self._loop.remove_signal_handler(sig)

    def disarm(self) -> None:
        self._armed = False

    @property
    def installed(self) -> bool:
        """Whether a signal can reach this process's handler (not when the loop runs off the main thread)."""
        return bool(self._installed)

    async def wait(self) -> None:
        """Disarm, then return at the next SIGINT or SIGTERM: the run is over, a signal only ends this wait."""
        self.disarm()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _on_signal(self) -> None:
        self._received += 1
        if self._received > 1:
            sys.stderr.write("interrupted again: exiting without a clean shutdown\n")
            sys.stderr.flush()
            os._exit(ExitCode.INTERRUPTED)
        if self._waiter is not None:
            if not self._waiter.done():
                self._waiter.set_result(None)
        elif self._armed:
            self.fired = True
            self._task.cancel()


def _asks_for_telemetry() -> bool:
    """Whether the OpenTelemetry variables ask for traces; without any ``OTEL_*`` variable the server (FastAPI,
    uvicorn: ~0.4 s of start-up) is not even imported to ask."""
    if not any(name.startswith("OTEL_") for name in os.environ):
        return False
    # Decision: set OTEL_* variables ask for tracing, which lives in planweave.server (fastapi) and needs the SDK.
    require("telemetry", "tracing (asked for by the OTEL_* variables)")
    from planweave.server.app import telemetry_from_env

    return telemetry_from_env()


async def _observe(engine: Engine, session: Session, stack: AsyncExitStack) -> Any:
    """Before the run starts: tracing (when the OpenTelemetry variables ask for it) and ``--watch``'s server.

    Returns the server (a :class:`planweave.server.LiveServer`) when watching, else None.
    """
    if _asks_for_telemetry():
        from planweave.server.telemetry import instrument, tracer_provider_from_env

        provider = tracer_provider_from_env()
        stack.callback(provider.shutdown)  # after the engine closed: spans of interrupted runs are ended
        instrument(engine, provider)
    if session.watch_port is not None:
        require("server", "--watch (the live server)")
        from planweave.server.app import serving

        return await stack.enter_async_context(serving(
            engine, port=session.watch_port, journal_url=session.journal_url, quiet=True, out=sys.stderr))
    return None


async def _announce(run: Run, journal: Journal, session: Session, console: Console | None, verb: str) -> None:
    """Print ``run RUN_ID started (resume with: ...)`` first thing: on the live view's console, else on stderr.

    A durable journal is flushed first, so from the moment the line is printed a killed run can be resumed.
    """
    if journal.durable:
        await journal.flush()
        line = f"run {run.id} {verb} (resume with: {session.resume_command(run.id)})"
    else:
        line = f"run {run.id} {verb} (the journal {session.journal_url} is not durable: it cannot be resumed)"
    (console or views.console(stderr=True)).print(line, markup=False, soft_wrap=True)


async def follow_run(
    session: Session,
    limits: Callable[[Journal], Awaitable[Limits]],
    begin: Callable[[Engine, AsyncExitStack], Awaitable[Run]],
    console: Console | None,
    verb: str = "started",
) -> Outcome:
    """Open the journal and an engine, begin the run, announce it, show it live and wait for its end or an interrupt.

    ``begin`` may open contexts (a model client) on the stack it gets: they close after the engine. ``verb`` says
    what happened to the run in the announcement (``started``, ``resumed``).
    """
    task = asyncio.current_task()
    assert task is not None
    clock: Clock = VirtualClock() if session.virtual else RealClock()
    run: Run | None = None
    durable = False
    with _InterruptSignals(task) as signals:
        try:
            async with AsyncExitStack() as stack, open_journal(session.journal_url) as journal:
                durable = journal.durable
                limit = await limits(journal)
                tools = await open_mcp(stack, session.mcp_flags, session.tools)
                secrets = SecretRedactor()  # also keeps secrets written in the plan out of the journal
                async with Engine(
                    journal, clock=clock, concurrency=limit.concurrency, capacities=limit.capacities,
                    tools=tools, redact=secrets, executor=session.executor.executor(), cache=session.cache,
                ) as engine:
                    server = await _observe(engine, session, stack)
                    run = await begin(engine, stack)
                    await _announce(run, journal, session, console, verb)
                    if server is not None:
                        (console or Console(stderr=True)).print(f"watch it at {server.dashboard_url(run.id)}",
                                                                markup=False)
                    view = views.LiveRunView(console, clock, ticking=not session.virtual, all_rows=session.all_rows,
                                             journal_flag=journal_flag(session.journal_url),
                                             flush=journal.flush) if console else None
                    with view.follow(run) if view is not None else nullcontext():
                        result = await run.wait()
                    outcome = _finished(result, run.state, durable, secrets)
                    if server is not None and signals.installed:
                        outcome = await _keep_serving(outcome, session, server.dashboard_url(run.id), signals)
                    signals.disarm()
            return outcome
        except asyncio.CancelledError:
            if not signals.fired:
                raise
            task.uncancel()
    # Interrupted: the engine has closed and the journal holds everything the run did.
    state = run.state if run is not None else None
    report: dict[str, Any] = (run_report(state, "interrupted") if state is not None
                              else {"run_id": None, "status": "interrupted", "steps": {}})
    if run is not None and durable:
        report["resume"] = session.resume_command(run.id)
    return Outcome(run.id if run else None, "interrupted", None, report, state, durable)


def _finished(result: RunResult, state: RunState, durable: bool, secrets: SecretRedactor | None = None) -> Outcome:
    """The ``run --json`` object: :func:`planweave.runview.run_report` (as ``show --json`` and ``GET /runs/{id}``),
    everything in it redacted of this process's secrets (``secrets``: the engine's redactor, which also hides the
    run's model endpoint's key and headers' values)."""
    report = run_report(state, result.status, result.outputs)
    hide = secrets if secrets else shown_redaction()
    if hide is not None:
        report = hide(report)
    return Outcome(result.run_id, result.status, result.error, report, state, durable)


async def _keep_serving(outcome: Outcome, session: Session, url: str, signals: _InterruptSignals) -> Outcome:
    """``--watch`` after the run ended: say how it ended (the ``--json`` object now, on stdout), then keep the
    dashboard up until SIGINT or SIGTERM. Returns the outcome marked as reported: the exit code stays the run's."""
    with real_stdout():
        report_outcome(outcome, session)
    Console(stderr=True, highlight=False).print(
        f"run {outcome.run_id} ended ({outcome.status}): the dashboard stays up at {url} until Ctrl-C",
        markup=False, soft_wrap=True)
    await signals.wait()
    return replace(outcome, reported=True)


def run_loop(main: Coroutine[Any, Any, T], virtual: bool) -> T:
    """Run ``main`` on a new event loop whose default executor has daemon threads.

    ``asyncio.run`` joins the default executor's threads before it returns: a tool calling ``asyncio.to_thread``
    with a call that never returns would hold the command there forever.
    """
    guarded = _with_daemon_executor(main)
    return run_virtual(guarded) if virtual else asyncio.run(guarded)


async def _with_daemon_executor(main: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_default_executor(ToolThreads(name="planweave-default"))
    return await main


def console_for(json_output: bool) -> Console | None:
    """Where the live view goes: stdout, or with ``--json`` stderr if that is a terminal (else nowhere)."""
    if not json_output:
        return views.console()
    return views.console(stderr=True) if sys.stderr.isatty() else None


def report_outcome(outcome: Outcome, session: Session) -> None:
    """Print how the run ended: the ``--json`` object on stdout, else a status line (and the error, the answer).

    Nothing when that was printed already (``--watch`` prints it when the run ends, before serving on).
    """
    if outcome.reported:
        return
    if session.json_output:
        print_json(outcome.report)
    out = views.console(stderr=session.json_output)
    if outcome.status == "interrupted":
        if outcome.run_id is None:
            out.print("interrupted before the run started", markup=False)
        elif outcome.durable:
            out.print(f"interrupted: resume with {session.resume_command(outcome.run_id)}", markup=False)
        else:
            out.print(f"interrupted: the journal {session.journal_url} is not durable, so run "
                      f"{outcome.run_id} cannot be resumed", markup=False)
        return
    if session.json_output:
        return
    makespan = (views.elapsed_text(outcome.state, outcome.state.finished_at) if outcome.state is not None
                else "") or views.format_duration(outcome.report.get("makespan_s"))  # the time it ran
    line = Text()
    line.append_text(views.status_text(outcome.status))
    line.append(f" {'in' if outcome.status == 'succeeded' else 'after'} {makespan} · run {outcome.run_id}")
    if outcome.state is not None:
        line.append(" · ")
        line.append_text(views.counts_text(outcome.state.counts()))
    out.print(line)
    if outcome.error:
        # A run that failed before any step was planned (no model to plan with) has nothing else to show: its error
        # is a command's error, on stderr.
        nothing_ran = outcome.status == "failed" and outcome.state is not None and not outcome.state.records
        (views.console(stderr=True) if nothing_ran else out).print(
            Text("error: ", style="bold red") + Text(outcome.error))
    if outcome.report.get("answer"):
        out.print(Text("answer: ", style="bold green") + Text(str(outcome.report["answer"])))
    if outcome.status != "succeeded":
        url = session.journal_url
        out.print(f"details: planweave show {outcome.run_id}"
                  + (f" --journal {redact_url(url)}" if url != default_journal_url() else ""),
                  markup=False, style="dim")


@dataclass(frozen=True)
class _Redirected:
    """Where stdout went before :func:`tool_output_to_stderr` pointed it at stderr."""

    stdout: TextIO
    fd: int | None  # stdout's descriptor, when it is a real file
    saved: int | None  # a duplicate of what ``fd`` was


# Set by tool_output_to_stderr for the run's event loop (asyncio.run copies the context into the main task).
_REDIRECTED: ContextVar[_Redirected | None] = ContextVar("planweave_stdout_redirected", default=None)


@contextmanager
def tool_output_to_stderr(enabled: bool) -> Iterator[None]:
    """While ``enabled`` (a ``--json`` run executes), what tools print goes to stderr, not into the JSON on stdout.

    Both ``sys.stdout`` and, when it is a real file, its descriptor are pointed at stderr, so ``print``, writes to
    fd 1 and child processes that inherit it all land there. The JSON is printed after this block, or in
    :func:`real_stdout` once the run ended (``--watch``).
    """
    if not enabled:
        yield
        return
    try:
        fd: int | None = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stdout (tests): only sys.stdout can be moved
        fd = None
    sys.stdout.flush()
    saved = os.dup(fd) if fd is not None else None
    if fd is not None:
        os.dup2(sys.stderr.fileno(), fd)
    token = _REDIRECTED.set(_Redirected(sys.stdout, fd, saved))
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _REDIRECTED.reset(token)
        sys.stderr.flush()
        if fd is not None and saved is not None:
            os.dup2(saved, fd)
            os.close(saved)


@contextmanager
def real_stdout() -> Iterator[None]:
    """Inside :func:`tool_output_to_stderr`: stdout as it was, for the block (the ``--json`` object of a run that
    ended while the command goes on); elsewhere, nothing changes."""
    redirected = _REDIRECTED.get()
    if redirected is None:
        yield
        return
    sys.stderr.flush()
    if redirected.fd is not None and redirected.saved is not None:
        os.dup2(redirected.saved, redirected.fd)
    try:
        with redirect_stdout(redirected.stdout):
            yield
    finally:
        redirected.stdout.flush()
        if redirected.fd is not None:
            os.dup2(sys.stderr.fileno(), redirected.fd)


# -- the commands ----------------------------------------------------------------------------------------------
