"""The ``planweave`` command: run, resume, inspect and cancel plans on a journal, and run the benchmarks.

This is planweave's only synchronous edge: each command runs one coroutine with ``asyncio.run`` (or
:func:`~planweave.clock.run_virtual`) and turns how it ended into output and an exit code (:class:`ExitCode`).
``--json`` output is exactly one JSON document on stdout; everything meant for people goes to stderr then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence, Sized
from contextlib import AsyncExitStack, contextmanager, nullcontext, redirect_stdout
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from planweave import __version__
from planweave.cli import views
from planweave.clock import Clock, RealClock, VirtualClock, run_virtual
from planweave.engine.events import Event
from planweave.engine.limits import JournaledLimits, RunLimits
from planweave.engine.report import StepNotFound, find_step, outputs_summary, step_detail
from planweave.engine.runtime import (
    DEFAULT_CONCURRENCY,
    Engine,
    Run,
    RunResult,
    process_alive,
    request_cancel,
    send_approval,
    send_input,
)
from planweave.engine.state import RunState
from planweave.errors import JournalError, PlanInvalid, PlanweaveError, RunError, RunNotFound
from planweave.extras import require
from planweave.journal import Journal, default_journal_url, open_journal
from planweave.plan.defaults import check_seconds, with_default_timeout
from planweave.plan.graph import validate_plan
from planweave.planfile import load_plan_file
from planweave.runview import run_overview, run_report, stored_outputs, unbounded
from planweave.tools import Tool, Toolbox, builtin_tools
from planweave.tools.isolation import ToolThreads
from planweave.tools.safety import SecretRedactor, redact, secret_values

if TYPE_CHECKING:
    from planweave.models import Budget
    from planweave.planning import PlanningLoop

T = TypeVar("T")


class ExitCode(IntEnum):
    """What a ``planweave`` process exit status means."""

    SUCCEEDED = 0
    FAILED = 1  # the run failed or was cancelled
    BAD_INPUT = 2  # invalid plan, unknown run, bad option: nothing was run
    INTERRUPTED = 130  # SIGINT/SIGTERM: the run is left resumable (128 + SIGINT, as shells report it)


class UsageError(PlanweaveError):
    """A command-line argument that cannot be used (a malformed ``--capacity``, an unimportable ``--tools``)."""


# -- reading runs back from a journal ----------------------------------------------------------------------------
def fold_run(run_id: str, events: Sequence[Event]) -> RunState:
    """Rebuild a run's state from its journaled events, the way resume does, without any tools.

    The plan comes from ``run_created`` (a document in durable journals, a PlanSpec in memory) and is validated
    without tool or capacity checks, since the tools it used may not be importable here.
    """
    if not events:
        raise RunNotFound(f"no run '{run_id}' in the journal")
    return RunState.from_events(run_id, events)


@dataclass(frozen=True)
class JournaledRun:
    """A run as its journal tells it: the folded state, who ran it last and when it last changed."""

    run_id: str
    state: RunState | None
    owner: Mapping[str, Any] = field(default_factory=dict)
    last_at: float | None = None
    problem: str | None = None  # why the events could not be folded (state is None then)
    outputs: Mapping[str, Any] = field(default_factory=dict)  # of succeeded steps, if read with outputs=True
    events: Sequence[Event] = ()  # the run's events, if read with outputs=True (for every attempt's error)

    @property
    def status(self) -> str:
        """The fold's status, except ``interrupted`` for a ``running`` run whose process is gone."""
        if self.state is None:
            return "unreadable"
        if self.state.status == "running" and not process_alive(self.owner):
            return "interrupted"
        return self.state.status

    @property
    def horizon(self) -> float | None:
        """Where a timeline of this run ends: its end, now while it runs on wall-clock time, or its last event."""
        if self.state is None:
            return None
        if self.state.finished_at is not None:
            return self.state.finished_at
        if self.status == "running" and self.last_at is not None and self.last_at >= 1e9:
            return time.time()
        return self.last_at

    def overview(self) -> dict[str, Any]:
        """The ``runs --json`` object (as ``GET /runs``): :func:`planweave.runview.run_overview`."""
        return run_overview(self.run_id, self.state, self.status, self.problem)

    def report(self) -> dict[str, Any]:
        """The ``show --json`` object: :func:`planweave.runview.run_report` (as ``GET /runs/{id}``) plus the owner."""
        assert self.state is not None
        report = run_report(self.state, self.status, self.outputs, redact=shown_redaction())  # as GET /runs/{id}
        report["owner"] = dict(self.owner)
        hide = shown_redaction()
        shown: dict[str, Any] = report if hide is None else hide(report)
        return shown


def _unbounded(state: RunState) -> list[str]:
    """The ``"unbounded"`` of the JSON reports (:func:`planweave.runview.unbounded`)."""
    return unbounded(state)


def _journaled(run_id: str, events: Sequence[Event]) -> JournaledRun:
    owner: Mapping[str, Any] = {}
    for event in events:
        if event.kind in ("run_created", "run_resumed"):
            owner = event.data.get("owner", {})
    last_at = events[-1].at if events else None
    try:
        return JournaledRun(run_id, fold_run(run_id, events), owner, last_at)
    except (PlanweaveError, KeyError, TypeError, ValueError) as exc:  # a damaged run must not hide the others
        return JournaledRun(run_id, None, owner, last_at, problem=f"cannot read this run: {exc}")


def _journal_file_missing(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist (reading it must not create it)."""
    if not url.startswith("sqlite:"):
        return False
    from planweave.journal.sqlite import path_of

    path = path_of(url)
    return path != ":memory:" and not Path(path).exists()


async def read_run(url: str, run_id: str, *, outputs: bool = False) -> JournaledRun:
    """One run of the journal at ``url`` (with ``outputs``: also its events and succeeded outputs); raises
    RunNotFound."""
    if _journal_file_missing(url):
        raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
        if not events:
            raise RunNotFound(f"no run '{run_id}' in the journal {url}")
        run = _journaled(run_id, events)
        if run.state is None:
            raise JournalError(f"run '{run_id}' in the journal {url}: {run.problem}")
        if outputs:
            run = dataclasses.replace(run, outputs=await stored_outputs(journal, run.state), events=events)
    return run


def _hide_secrets(state: RunState) -> None:
    """Redact, in place, the texts ``show`` prints of a state folded only to be shown: errors, answer, escalations.

    The journal holds them as the running process redacted them; this process may know more secrets.
    """
    hide = shown_redaction()
    if hide is None:
        return
    for rec in state.records.values():
        rec.error = hide(rec.error)
    state.error, state.answer = hide(state.error), hide(state.answer)
    state.escalations = hide(state.escalations)


def shown_redaction() -> Callable[[Any], Any] | None:
    """What hides this process's secrets (``tools.safety.secret_values``) in everything shown; None if none."""
    secrets = secret_values()
    return functools.partial(redact, secrets=secrets) if secrets else None


async def read_runs(url: str) -> list[JournaledRun]:
    """Every run in the journal at ``url``, oldest first (none if the journal file does not exist)."""
    if _journal_file_missing(url):
        return []
    async with open_journal(url) as journal:
        events = await journal.read(None)
    by_run: dict[str, list[Event]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return [_journaled(run_id, run_events) for run_id, run_events in by_run.items()]


# -- command-line inputs ----------------------------------------------------------------------------------------
def parse_capacities(flags: Iterable[str]) -> dict[str, int]:
    """``["gpu=2", "llm=4"]`` as a dict; raises UsageError naming the malformed flag."""
    out: dict[str, int] = {}
    for flag in flags:
        name, sep, amount = flag.partition("=")
        name = name.strip()
        try:
            value = int(amount)
        except ValueError:
            value = -1
        if not sep or not name or value < 1:
            raise UsageError(f"--capacity {flag!r}: expected NAME=N with N a whole number >= 1 (e.g. --capacity llm=4)")
        out[name] = value
    return out


def _as_toolbox(value: Any, spec: str, *, call: bool = True) -> Toolbox:
    if isinstance(value, Tool):
        return Toolbox({value.name: value})
    if isinstance(value, Mapping):
        box = Toolbox()
        for item in value.values():
            if not isinstance(item, Tool):
                raise UsageError(f"--tools {spec}: the mapping holds {type(item).__name__}, not Tool")
            box.add(item)
        return box
    if isinstance(value, list | tuple):
        box = Toolbox()
        for item in value:
            if not (isinstance(item, Tool) or callable(item)):
                raise UsageError(f"--tools {spec}: the list holds {type(item).__name__}, not a Tool or a function")
            box.add(item)
        return box
    if call and callable(value):
        return _as_toolbox(value(), spec, call=False)
    raise UsageError(
        f"--tools {spec}: expected a Toolbox, a list of tools or a function returning one, got {type(value).__name__}"
    )


@dataclass(frozen=True)
class Confinement:
    """What the built-in ``shell`` and ``file.*`` tools may touch (``--workdir``, ``--allow-exec``, ``--root``)."""

    workdir: Path = Path(".")
    allow_exec: tuple[str, ...] | None = None
    roots: tuple[Path, ...] = ()
    allow_env: tuple[str, ...] = ()  # env keys shell steps may set despite the exec rules (``--allow-env``)

    def toolbox(self) -> Toolbox:
        """The built-ins with ``shell`` confined to the working directory (and allowlist) and file tools."""
        from planweave.tools.safety import confined_shell, file_tools

        if self.allow_env and self.allow_exec is None:
            raise UsageError("--allow-env applies only with --allow-exec: without an allowlist any env is accepted")
        box = builtin_tools()
        box.add(confined_shell(allowlist=self.allow_exec, workdir=self.workdir, allow_env=self.allow_env))
        return box.merged(file_tools(list(self.roots) or [self.workdir]))


def load_tools(specs: Iterable[str], confinement: Confinement | None = None) -> Toolbox:
    """The built-in tools plus those named by ``--tools MODULE:ATTR`` flags; raises UsageError.

    ATTR may be a Toolbox, a Tool, a list of tools (or functions), or a function returning one of those. Modules
    are imported from the working directory too, as ``python -m`` would.
    """
    box = (confinement or Confinement()).toolbox()
    specs = list(specs)
    if specs and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise UsageError(f"--tools {spec!r}: expected MODULE:ATTR (e.g. --tools mypkg.tools:toolbox)")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except Exception as exc:  # importing user code can raise anything; say which flag it was
            raise UsageError(f"--tools {spec}: cannot import it: {type(exc).__name__}: {exc}") from None
        try:
            box = box.merged(_as_toolbox(target, spec))
        except ValueError as exc:
            raise UsageError(f"--tools {spec}: {exc}") from None
    return box


# -- running ---------------------------------------------------------------------------------------------------
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

    def resume_command(self, run_id: str) -> str:
        """The command that continues ``run_id`` with the same journal and tools."""
        parts = ["planweave", "resume", run_id]
        if self.journal_url != default_journal_url():
            parts += ["--journal", self.journal_url]
        for flag in self.tool_flags:
            parts += ["--tools", flag]
        for flag in self.mcp_flags:
            parts += ["--mcp", shlex.quote(flag)]
        return " ".join(parts)


@dataclass(frozen=True)
class Outcome:
    """How a ``run`` or ``resume`` command ended: ``status`` is succeeded, failed, cancelled or interrupted."""

    run_id: str | None
    status: str
    error: str | None
    report: Mapping[str, Any]
    state: RunState | None
    durable: bool

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
    keeps them resumable. Once the run is over (``disarm``) a first signal is ignored so the journal closes cleanly.
    """

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._loop = task.get_loop()
        self._armed = True
        self._received = 0
        self._installed: list[signal.Signals] = []
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

    def _on_signal(self) -> None:
        self._received += 1
        if self._received > 1:
            sys.stderr.write("interrupted again: exiting without a clean shutdown\n")
            sys.stderr.flush()
            os._exit(ExitCode.INTERRUPTED)
        if self._armed:
            self.fired = True
            self._task.cancel()


async def open_mcp(stack: AsyncExitStack, flags: Sequence[str], tools: Toolbox) -> Toolbox:
    """Connect the ``--mcp NAME=SPEC`` servers (for the life of ``stack``) and add their tools to ``tools``."""
    if not flags:
        return tools
    require("mcp", "--mcp (MCP servers)")
    from planweave.tools.mcp import MCPServer, connect_mcp  # the mcp SDK takes a second to import

    servers = [MCPServer.parse(flag) for flag in flags]
    return tools.merged(await stack.enter_async_context(connect_mcp(servers)))


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
    (console or Console(stderr=True, highlight=False)).print(line, markup=False, soft_wrap=True)


async def _follow(
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
                    tools=tools, redact=secrets,
                ) as engine:
                    server = await _observe(engine, session, stack)
                    run = await begin(engine, stack)
                    await _announce(run, journal, session, console, verb)
                    if server is not None:
                        (console or Console(stderr=True)).print(f"watch it at {server.dashboard_url(run.id)}",
                                                                markup=False)
                    view = views.LiveRunView(console, clock, ticking=not session.virtual, all_rows=session.all_rows,
                                             journal_flag=_journal_flag(session.journal_url),
                                             flush=journal.flush) if console else None
                    with view.follow(run) if view is not None else nullcontext():
                        result = await run.wait()
                    signals.disarm()
            return _finished(result, run.state, durable)
        except asyncio.CancelledError:
            if not signals.fired:
                raise
            task.uncancel()
    # Interrupted: the engine has closed and the journal holds everything the run did.
    state = run.state if run is not None else None
    report: dict[str, Any] = state.summary() if state is not None else {"run_id": None, "steps": {}}
    report["status"] = "interrupted"
    if state is not None:
        report["unbounded"] = _unbounded(state)
    if run is not None and durable:
        report["resume"] = session.resume_command(run.id)
    return Outcome(run.id if run else None, "interrupted", None, report, state, durable)


def _finished(result: RunResult, state: RunState, durable: bool) -> Outcome:
    report = dict(result.summary)
    report["root_cause"] = state.root_cause
    report["unbounded"] = _unbounded(state)
    hide = shown_redaction()
    report["outputs"] = outputs_summary(state, result.outputs)
    if hide is not None:
        report = hide(report)
    return Outcome(result.run_id, result.status, result.error, report, state, durable)


def _run_loop(main: Coroutine[Any, Any, T], virtual: bool) -> T:
    """Run ``main`` on a new event loop whose default executor has daemon threads.

    ``asyncio.run`` joins the default executor's threads before it returns: a tool calling ``asyncio.to_thread``
    with a call that never returns would hold the command there forever.
    """
    guarded = _with_daemon_executor(main)
    return run_virtual(guarded) if virtual else asyncio.run(guarded)


async def _with_daemon_executor(main: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_default_executor(ToolThreads(name="planweave-default"))
    return await main


def _console_for(json_output: bool) -> Console | None:
    """Where the live view goes: stdout, or with ``--json`` stderr if that is a terminal (else nowhere)."""
    if not json_output:
        return Console(highlight=False)
    return Console(stderr=True, highlight=False) if sys.stderr.isatty() else None


def _report_outcome(outcome: Outcome, session: Session) -> None:
    if session.json_output:
        _print_json(outcome.report)
    out = Console(stderr=session.json_output, highlight=False)
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
    makespan = views.format_duration(outcome.report.get("makespan_s"))
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
        (Console(stderr=True, highlight=False) if nothing_ran else out).print(
            Text("error: ", style="bold red") + Text(outcome.error))
    if outcome.report.get("answer"):
        out.print(Text("answer: ", style="bold green") + Text(str(outcome.report["answer"])))
    if outcome.status != "succeeded":
        out.print(f"details: planweave show {outcome.run_id}"
                  + (f" --journal {session.journal_url}" if session.journal_url != default_journal_url() else ""),
                  markup=False, style="dim")


_JSON_PRINTED: list[bool] = []  # not empty once a --json command printed its object (main() checks it)


def _print_json(value: Any) -> None:
    _JSON_PRINTED.append(True)
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _plain_errors(exc: BaseException) -> list[PlanweaveError] | None:
    """The planweave errors inside ``exc`` (the engine's TaskGroup wraps them in groups), or None if others too."""
    if isinstance(exc, PlanweaveError):
        # A journal that lost a write stops the run (RunError: how to resume it), then fails to close: say both.
        if isinstance(exc, JournalError) and isinstance(exc.__context__, RunError):
            return [exc.__context__, exc]
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        found: list[PlanweaveError] = []
        for inner in exc.exceptions:
            plain = _plain_errors(inner)
            if plain is None:
                return None
            found += plain
        return found
    return None


def _error_document(errors: Sequence[PlanweaveError]) -> dict[str, Any]:
    """The ``--json`` object of a command that could not run: ``invalid`` with every plan problem, else ``error``."""
    invalid = [e for e in errors if isinstance(e, PlanInvalid)]
    problems = [p for e in invalid for p in e.problems]
    if problems:
        return {"status": "invalid", "source": invalid[0].source, "problems": [
            {"step": p.step, "field": p.field, "message": p.message, "text": str(p)} for p in problems]}
    return {"status": "error", "error": "; ".join(str(e) for e in errors)}


@contextmanager
def _clean_errors(json_output: bool = False) -> Iterator[None]:
    """Print planweave errors as their message on stderr and exit 2: people see no traceback for them.

    With ``json_output`` stdout gets their :func:`_error_document` too: ``--json`` always prints one object.
    """
    try:
        yield
    except Exception as exc:
        errors = _plain_errors(exc)
        if errors is None:
            raise
        for error in errors:
            typer.echo(str(error) if isinstance(error, PlanInvalid) else f"error: {error}", err=True)
        if json_output:
            _print_json(_error_document(errors))
        raise typer.Exit(ExitCode.BAD_INPUT) from None


@contextmanager
def _tool_output_to_stderr(enabled: bool) -> Iterator[None]:
    """While ``enabled`` (a ``--json`` run executes), what tools print goes to stderr, not into the JSON on stdout.

    Both ``sys.stdout`` and, when it is a real file, its descriptor are pointed at stderr, so ``print``, writes to
    fd 1 and child processes that inherit it all land there. The JSON is printed after this block.
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
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if fd is not None and saved is not None:
            os.dup2(saved, fd)
            os.close(saved)


# -- the commands ----------------------------------------------------------------------------------------------
app = typer.Typer(
    name="planweave",
    help="Plan long-horizon agent tasks as DAGs and run them event-driven on a durable journal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks: AsyncHow makespans, engine overhead, planning.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
tools_app = typer.Typer(help="Tools: built-ins, Python tools (--tools) and MCP servers (--mcp).",
                        no_args_is_help=True)
app.add_typer(tools_app, name="tools")

JournalOption = Annotated[
    str | None,
    typer.Option("--journal", metavar="URL",
                 help="Journal URL (sqlite:///path.db, postgresql://..., memory://); default $PLANWEAVE_JOURNAL "
                      "or sqlite:///.planweave/runs.db."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout and nothing else.")]
ToolsOption = Annotated[
    list[str] | None,
    typer.Option("--tools", metavar="MODULE:ATTR",
                 help="Also use these tools: a Toolbox, a list of tools or a function returning one (repeatable)."),
]
VirtualOption = Annotated[
    bool, typer.Option("--virtual-clock", help="Run on virtual time: sleeps and timeouts take no real time."),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"planweave {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Plan long-horizon agent tasks as DAGs and run them event-driven on a durable journal."""


WorkdirOption = Annotated[
    Path, typer.Option("--workdir", help="The shell tool's jail: its cwd must stay inside (default: here).")]
AllowExecOption = Annotated[
    list[str] | None,
    typer.Option("--allow-exec", metavar="PROGRAM", help="Only these programs may run in shell steps (repeatable)."),
]
AllowEnvOption = Annotated[
    list[str] | None,
    typer.Option("--allow-env", metavar="NAME",
                 help="With --allow-exec: shell steps may set this env key (e.g. PATH, GIT_*) after all (repeatable)."),
]
RootOption = Annotated[
    list[Path] | None,
    typer.Option("--root", metavar="DIR", help="Directories the file.* tools may use (repeatable; default: workdir)."),
]
@dataclass(frozen=True)
class AgentFlags:
    """The model, budget and limits of a ``--goal`` run (or of resuming one)."""

    model: str
    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None
    deadline: float | None
    max_replans: int
    plan_max_tokens: int
    ask_human: bool = False  # the ladder's last rung asks a person (human.input) instead of failing the run

    async def planning_loop(self, engine: Engine, stack: AsyncExitStack, toolbox: Toolbox) -> PlanningLoop:
        """A :class:`planweave.planning.PlanningLoop` on a client opened for the life of ``stack``, with ``llm``."""
        from planweave.models import Budget, resolve_model
        from planweave.planning import PlanningLoop, PlanningOptions
        from planweave.tools.llm import llm_tool

        options: dict[str, Any] = {"base_url": self.base_url} if self.base_url else {}
        client = await stack.enter_async_context(resolve_model(self.model, **options))
        budget = (Budget(usd=self.budget_usd, tokens=self.budget_tokens)
                  if (self.budget_usd or self.budget_tokens) else None)
        base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
        catalog = base if "llm" in base else base.merged(Toolbox({"llm": llm_tool(client, budget)}))
        return PlanningLoop(engine, client, catalog, budget=budget, options=PlanningOptions(
            deadline_s=self.deadline, max_replans=self.max_replans, plan_max_tokens=self.plan_max_tokens,
            join_max_tokens=min(1024, self.plan_max_tokens), ask_human=self.ask_human))


DEFAULT_GOAL_MODEL = "gpt-4o-mini"


@dataclass(frozen=True)
class PlanModel:
    """The model a plan file's ``llm`` steps call (``run plan.yaml --model M``), within an optional budget."""

    model: str
    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None

    @staticmethod
    def from_flags(
        model: str | None, base_url: str | None, budget_usd: float | None, budget_tokens: int | None,
        max_replans: int | None, plan_max_tokens: int | None,
    ) -> PlanModel | None:
        """The model of a plan-file run, or None without ``--model``; raises UsageError naming a flag that does not
        apply to a plan file (it would be silently ignored otherwise)."""
        for flag, value in (("--max-replans", max_replans), ("--plan-max-tokens", plan_max_tokens)):
            if value is not None:
                raise UsageError(f"{flag} applies to --goal runs only: a plan file is not re-planned")
        if model is None:
            for flag, given in (("--base-url", base_url), ("--budget-usd", budget_usd),
                                ("--budget-tokens", budget_tokens)):
                if given is not None:
                    raise UsageError(f"{flag} applies to the model that a plan file's llm steps call: give "
                                     "--model NAME too")
            return None
        return PlanModel(model, base_url, budget_usd, budget_tokens)

    async def toolbox(self, stack: AsyncExitStack, tools: Toolbox, budget: Budget | None) -> Toolbox:
        """``tools`` plus ``llm`` on this model (opened for the life of ``stack``), spending at most ``budget``."""
        from planweave.models import resolve_model
        from planweave.tools.llm import llm_tool

        client = await stack.enter_async_context(
            resolve_model(self.model, **({"base_url": self.base_url} if self.base_url else {})))
        return tools if "llm" in tools else tools.merged(Toolbox({"llm": llm_tool(client, budget)}))


@dataclass(frozen=True)
class ResumeLimits:
    """The limits given to ``planweave resume`` without ``--model`` (None: keep the run's journaled ones)."""

    base_url: str | None
    budget_usd: float | None
    budget_tokens: int | None
    deadline: float | None  # a new deadline, counted from the resume

    async def resume(self, engine: Engine, stack: AsyncExitStack, toolbox: Toolbox, run_id: str,
                     retry_unknown: bool) -> Run:
        """Resume ``run_id`` within the limits it was started with (the ones given here replace them): its ``llm``
        steps on the model it journaled, within what is left of its budget, and its deadline at the time it was
        set for; raises UsageError naming a flag that does not apply to the run."""
        recorded = JournaledLimits.from_events(await engine.journal.read(run_id)).with_overrides(
            RunLimits(self.budget_usd, self.budget_tokens, self.deadline), engine.clock.now())
        tools = None
        if recorded.model is None:
            self._check_without_model(run_id)
        else:
            base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
            tools = await PlanModel(recorded.model, self.base_url, None, None).toolbox(stack, base, recorded.budget())
        run = await engine.resume(run_id, tools=tools, retry_unknown=retry_unknown)
        recorded.apply_deadline(engine, run)
        return run

    def _check_without_model(self, run_id: str) -> None:
        for flag, given in (("--base-url", self.base_url), ("--budget-usd", self.budget_usd),
                            ("--budget-tokens", self.budget_tokens)):
            if given is not None:
                raise UsageError(f"{flag} applies to the model a run calls, and run '{run_id}' was started without "
                                 "one: give --model NAME too (a --goal run), or leave it out")


AskHumanOption = Annotated[
    bool,
    typer.Option("--ask-human", help="For a --goal run: when retries, fallbacks and re-plans cannot repair a failed "
                                     "step, ask a person (a human.input step: retry, skip with a value, or abort) "
                                     "instead of failing."),
]
McpOption = Annotated[
    list[str] | None,
    typer.Option("--mcp", metavar="NAME=COMMAND_OR_URL",
                 help="Connect an MCP server (a command over stdio, or an http(s) URL); its tools are NAME.tool "
                      "(repeatable)."),
]


def _step_timeout_flag(value: float | None) -> float | None:
    """``--step-timeout`` checked: finite seconds above 0 (UsageError otherwise)."""
    try:
        return None if value is None else check_seconds(value, "--step-timeout")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@app.command()
def run(
    file: Annotated[Path | None, typer.Argument(help="The plan file (YAML or JSON); or use --goal.",
                                                show_default=False)] = None,
    journal: JournalOption = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id for the new run (default: random).")] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Most steps running at once (default: the plan's).")
    ] = None,
    capacity: Annotated[
        list[str] | None,
        typer.Option("--capacity", metavar="NAME=N", help="Capacity of a resource; overrides the plan's (repeatable)."),
    ] = None,
    step_timeout: Annotated[float | None, typer.Option(
        "--step-timeout", metavar="S",
        help="Seconds per attempt for steps without their own timeout; overrides the plan's defaults.timeout "
             "(default: the plan's, else 600; a step's own timeout: null means no limit; steps waiting on people "
             "are exempt).")] = None,
    virtual_clock: VirtualOption = False,
    json_output: JsonOption = False,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    goal: Annotated[str | None, typer.Option("--goal", help="Plan this goal with a model instead of a file.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help=f"Model for --goal (default {DEFAULT_GOAL_MODEL}) and for a plan file's llm steps ('local': "
                        "the bundled local model).", envvar="PLANWEAVE_MODEL")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", metavar="URL",
                                                 help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=0, help="Hard budget in USD.")] = None,
    budget_tokens: Annotated[int | None, typer.Option("--budget-tokens", min=0, help="Hard budget in tokens.")] = None,
    deadline: Annotated[float | None, typer.Option("--deadline", min=0, help="Stop after this many seconds.")] = None,
    max_replans: Annotated[int | None, typer.Option("--max-replans", min=0,
                                                    help="Most re-plans of a --goal run (default 5).")] = None,
    plan_max_tokens: Annotated[int | None, typer.Option(
        "--plan-max-tokens", min=16, help="Most tokens the planner of a --goal run may write per call (default "
                                          "2048).")] = None,
    ask_human: AskHumanOption = False,
    on_failure: Annotated[Literal["stop", "continue"] | None, typer.Option(
        "--on-failure", help="A plan file's step failing for good: stop the run (cancel what runs, start nothing "
                             "new) or continue the other branches (default: the plan's on_failure, else stop).",
    )] = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    allow_env: AllowEnvOption = None,
    root: RootOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Also serve the dashboard for this run.")] = False,
    port: Annotated[int, typer.Option("--port", help="Port of --watch's dashboard.")] = 8765,
    all_rows: Annotated[bool, typer.Option("--all", help="End with a row for every step (default: counts, the "
                                                         "failed and the slowest steps).")] = False,
) -> None:
    """Run a plan file (or plan and run a --goal), showing its steps live; exit 0 only if the run succeeded."""
    with _clean_errors(json_output):
        if (file is None) == (goal is None):
            raise UsageError("give a plan FILE or --goal TEXT (one of the two)")
        flags = parse_capacities(capacity or ())
        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(root or ()), tuple(allow_env or ())))
        session = Session(journal or default_journal_url(), toolbox, tuple(tools or ()), virtual_clock, json_output,
                          tuple(mcp or ()), port if watch else None, all_rows=all_rows)
        begin: Callable[[Engine, AsyncExitStack], Awaitable[Run]]
        if file is not None:
            plan_model = PlanModel.from_flags(model or None, base_url, budget_usd, budget_tokens, max_replans,
                                              plan_max_tokens)
            if ask_human:
                raise UsageError("--ask-human applies to --goal runs: a plan file has no planner to climb the "
                                 "escalation ladder (use approval: or human.input steps in the plan)")
            spec = load_plan_file(file)
            spec = with_default_timeout(spec, _step_timeout_flag(step_timeout))
            capacities = {**spec.capacities, **flags}
            if not mcp and plan_model is None:  # MCP tools and llm are known only once connected: then the
                # engine validates at start.
                # Check everything before the journal is opened: an invalid plan leaves no trace there.
                validate_plan(spec, toolbox, capacities, source=str(file))
            limits = Limits(concurrency or spec.concurrency or DEFAULT_CONCURRENCY, capacities)

            async def begin_file(engine: Engine, stack: AsyncExitStack) -> Run:
                base = engine.tools if isinstance(engine.tools, Toolbox) else toolbox
                run_limits = RunLimits(budget_usd=budget_usd, budget_tokens=budget_tokens, deadline=deadline)
                tools = (await plan_model.toolbox(stack, base, run_limits.budget()) if plan_model is not None
                         else None)
                started = await engine.start(spec, tools=tools, run_id=run_id, source=str(file),
                                             on_failure=on_failure, limits=run_limits.journaled(
                                                 engine.clock.now(), plan_model.model if plan_model else None))
                if deadline is not None:
                    from planweave.engine.runtime import cancel_at_deadline

                    cancel_at_deadline(engine, started, deadline)
                return started

            begin = begin_file
        else:
            assert goal is not None
            if step_timeout is not None:
                raise UsageError("--step-timeout applies to plan files: the steps of a --goal run are written by "
                                 "its planner, with their own timeouts")
            if on_failure is not None:
                raise UsageError("--on-failure applies to plan files: a --goal run lets the other branches run on "
                                 "while its planner repairs a failure, and fails only once the escalation ladder "
                                 "is exhausted (see --max-replans and --ask-human)")
            limits = Limits(concurrency or DEFAULT_CONCURRENCY, flags)
            goal_text = goal

            agent = AgentFlags(model or DEFAULT_GOAL_MODEL, base_url, budget_usd, budget_tokens, deadline,
                               5 if max_replans is None else max_replans, plan_max_tokens or 2048, ask_human)

            async def begin_goal(engine: Engine, stack: AsyncExitStack) -> Run:
                loop = await agent.planning_loop(engine, stack, toolbox)
                return await loop.start(goal_text, run_id=run_id)

            begin = begin_goal

        async def fixed_limits(_journal: Journal) -> Limits:
            return limits

        with _tool_output_to_stderr(json_output):
            outcome = _run_loop(_follow(session, fixed_limits, begin, _console_for(json_output)), virtual_clock)
    _report_outcome(outcome, session)
    raise typer.Exit(outcome.exit_code)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.", show_default=False)],
    journal: JournalOption = None,
    retry_unknown: Annotated[
        bool,
        typer.Option("--retry-unknown",
                     help="Run again the non-idempotent steps that were running when the run was interrupted."),
    ] = False,
    json_output: JsonOption = False,
    tools: ToolsOption = None,
    mcp: McpOption = None,
    virtual_clock: VirtualOption = False,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    allow_env: AllowEnvOption = None,
    root: RootOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="For a --goal run: re-attach this model, its planner and the llm tool.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", metavar="URL",
                                                 help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=0, help="Hard budget in USD.")] = None,
    budget_tokens: Annotated[int | None, typer.Option("--budget-tokens", min=0, help="Hard budget in tokens.")] = None,
    deadline: Annotated[float | None, typer.Option("--deadline", min=0, help="Stop after this many seconds.")] = None,
    max_replans: Annotated[int | None, typer.Option("--max-replans", min=0,
                                                    help="Most re-plans of a --goal run (default 5).")] = None,
    ask_human: AskHumanOption = False,
    all_rows: Annotated[bool, typer.Option("--all", help="End with a row for every step (default: counts, the "
                                                         "failed and the slowest steps).")] = False,
) -> None:
    """Continue an interrupted or failed run: finished steps are kept, the rest runs with the run's own limits.

    The run keeps the values journaled when it started: its concurrency, capacities and step timeouts (the plan's
    defaults.timeout, or the --step-timeout or built-in default it was run with) are not changed by a resume.
    """
    with _clean_errors(json_output):
        url = journal or default_journal_url()
        if _journal_file_missing(url):
            raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")
        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(root or ()), tuple(allow_env or ())))
        session = Session(url, toolbox, tuple(tools or ()), virtual_clock, json_output, tuple(mcp or ()),
                          all_rows=all_rows)

        async def recorded_limits(opened: Journal) -> Limits:
            # The engine must admit steps as the original run did: its limits are in run_created.
            events = await opened.read(run_id)
            if not events:
                raise RunNotFound(f"no run '{run_id}' in the journal {url}")
            options = events[0].data.get("options") or {}
            return Limits(options.get("concurrency"), dict(options.get("capacities") or {}))

        if ask_human and model is None:
            raise UsageError("--ask-human applies to a --goal run resumed with its planner: give --model NAME too")
        if max_replans is not None and model is None:
            raise UsageError("--max-replans applies to a --goal run resumed with its planner: give --model NAME too")
        given = ResumeLimits(base_url, budget_usd, budget_tokens, deadline)

        async def begin(engine: Engine, stack: AsyncExitStack) -> Run:
            if model is not None:
                agent = AgentFlags(model, base_url, budget_usd, budget_tokens, deadline,
                                   5 if max_replans is None else max_replans, 2048, ask_human)
                loop = await agent.planning_loop(engine, stack, toolbox)
                return await loop.resume(run_id, retry_unknown=retry_unknown)
            try:
                return await given.resume(engine, stack, toolbox, run_id, retry_unknown)
            except PlanInvalid as exc:
                if any("unknown tool 'llm'" in str(p) for p in exc.problems):
                    raise UsageError(f"{exc}\n(run '{run_id}' calls a model: resume it with --model NAME to "
                                     "re-attach its model, planner and llm tool)") from None
                raise

        with _tool_output_to_stderr(json_output):
            outcome = _run_loop(_follow(session, recorded_limits, begin, _console_for(json_output), "resumed"),
                                virtual_clock)
    _report_outcome(outcome, session)
    raise typer.Exit(outcome.exit_code)


@app.command()
def runs(journal: JournalOption = None, json_output: JsonOption = False) -> None:
    """List every run in the journal: status, start, duration and steps by state."""
    with _clean_errors(json_output):
        url = journal or default_journal_url()
        found = asyncio.run(read_runs(url))
    rows = [r.overview() for r in found]
    if json_output:
        _print_json(rows)
        return
    console = Console(highlight=False)
    if not rows:
        console.print(f"no runs in the journal {url}", markup=False)
        return
    console.print(views.runs_table(rows))


def _no_output(rec_status: str) -> str:
    """Why a step in ``rec_status`` has no output, as the end of a sentence."""
    return {"failed": "it failed", "skipped": "it was skipped", "cancelled": "it was cancelled",
            "pending": "it has not started", "ready": "it has not started", "running": "it is still running",
            "unknown": "its outcome is unknown (it was running when the run was interrupted)",
            "succeeded": "its output is missing from the journal"}.get(rec_status, f"it is {rec_status}")


def _step_or_exit(found: JournaledRun, step: str, *, need_output: bool, json_output: bool = False) -> None:
    """Exit 1 with a message if ``found`` has no step ``step`` (or, with ``need_output``, no output for it)."""
    assert found.state is not None
    try:
        rec = find_step(found.state, step)
        problem = None
    except StepNotFound as exc:
        problem = str(exc)
    else:
        if need_output and (rec.status != "succeeded" or step not in found.outputs):
            problem = f"step '{step}' of run '{found.run_id}' has no output: {_no_output(rec.status)}"
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        if json_output:
            _print_json({"status": "error", "error": problem})
        raise typer.Exit(ExitCode.FAILED)


@app.command()
def output(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step whose output to print.", show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Print one step's whole output as JSON on stdout; exit 1 if the step does not exist or has no output."""
    with _clean_errors():
        found = asyncio.run(read_run(journal or default_journal_url(), run_id, outputs=True))
    _step_or_exit(found, step, need_output=True)
    hide = shown_redaction()
    value = found.outputs[step]
    _print_json(value if hide is None else hide(value))


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.", show_default=False)],
    journal: JournalOption = None,
    json_output: JsonOption = False,
    step: Annotated[str | None, typer.Option(
        "--step", metavar="ID", help="Show this step: its arguments, every attempt, errors and output.")] = None,
    all_rows: Annotated[bool, typer.Option("--all", help="A row for every step (default: counts, the failed and "
                                                         "the slowest steps).")] = False,
) -> None:
    """Show one run: its steps, its error and root cause, and a timeline of every attempt (or one ``--step``)."""
    with _clean_errors(json_output):
        url = journal or default_journal_url()
        found = asyncio.run(read_run(url, run_id, outputs=json_output or step is not None))
    assert found.state is not None
    if step is not None:
        _step_or_exit(found, step, need_output=False, json_output=json_output)
        detail = step_detail(found.state, found.outputs, step, events=found.events, redact=shown_redaction())
        if json_output:
            _print_json(detail)
        else:
            Console(highlight=False).print(views.step_panel(detail, found.state.created_at))
        return
    if json_output:
        _print_json(found.report())
        return
    state = found.state
    _hide_secrets(state)
    console = Console(highlight=False)
    console.print(views.run_header(state, found.horizon, found.status))
    times = Text(f"started {views.format_instant(state.created_at)}", style="dim")
    if state.finished_at is not None:
        times.append(f" · finished {views.format_instant(state.finished_at)}")
    console.print(times)
    if state.error:
        console.print(Text("error: ", style="bold red") + Text(state.error))
    if state.root_cause and state.root_cause not in (state.error or ""):
        console.print(Text(f"root cause: step '{state.root_cause}'", style="red"))
    if found.status == "interrupted":
        console.print(f"interrupted: resume with planweave resume {run_id}"
                      + (f" --journal {url}" if url != default_journal_url() else ""), markup=False)
    if state.answer:  # a run that did not succeed has no answer: its joiner's text is only partial
        label, style = ("answer: ", "bold green") if state.status == "succeeded" else ("partial answer: ", "yellow")
        console.print(Text(label, style=style) + Text(state.answer))
    if state.model_calls:
        console.print(Text(f"model: {len(state.model_calls)} calls · {state.tokens:,} tokens · "
                           f"${state.cost_usd:.4f}", style="dim"))
    console.print()
    shown = None if all_rows else views.summary_steps(state, found.horizon, views.SUMMARY_TOP)[0]
    console.print(views.steps_table(state, found.horizon, detailed=True, top=None if all_rows else views.SUMMARY_TOP,
                                    more_hint=views.ALL_HINT))
    hint = views.unbounded_hint(state) if found.status in ("running", "interrupted") else None
    if hint is not None:
        console.print(hint)
    console.print()
    console.print(Text("timeline", style="bold"))
    console.print(views.timeline(state, console.width, found.horizon, shown), soft_wrap=True)
    if len(state.versions) > 1 or state.model_calls:
        console.print()
        console.print(views.versions_table(state))
    if state.escalations:
        console.print()
        console.print(Text("escalations", style="bold"))
        for esc in state.escalations:
            where = f" step '{esc['step']}'" if esc.get("step") else ""
            console.print(Text(f"  {esc.get('rung')}{where}: {esc.get('reason', '')}"[:400]))


def _journal_flag(url: str) -> str:
    """`` --journal URL`` for commands printed for people, or nothing for the default journal."""
    return "" if url == default_journal_url() else f" --journal {url}"


def _reply(url: str, run_id: str, give: Callable[[Journal], Awaitable[str]]) -> str:
    """Open the journal at ``url`` and journal a person's answer with ``give``; how it will be applied."""
    if _journal_file_missing(url):
        raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")

    async def go() -> str:
        async with open_journal(url) as opened:
            return await give(opened)

    done = asyncio.run(go())
    if done == "applied":
        return "the process running it applies it within a second"
    return f"no process runs it, so it is recorded and applies when the run resumes: planweave resume {run_id}" + \
        _journal_flag(url)


@app.command()
def approve(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step waiting for approval.", show_default=False)],
    reject: Annotated[bool, typer.Option("--reject", help="Reject it: the step fails (kind rejected).")] = False,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="Why, for the journal.")] = None,
    journal: JournalOption = None,
) -> None:
    """Approve (or ``--reject``) a step waiting for approval, from any process sharing the run's journal."""
    with _clean_errors():
        url = journal or default_journal_url()
        how = _reply(url, run_id, lambda opened: send_approval(opened, run_id, step, approve=not reject,
                                                               reason=reason))
    typer.echo(f"{'rejected' if reject else 'approved'} step '{step}' of run {run_id}: {how}")


def parse_value(text: str) -> Any:
    """The JSON of ``--value``; raises UsageError saying how to quote a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--value {text!r} is not JSON ({exc.msg}); a string needs quotes, e.g. "
                         f"--value '{json.dumps(text)}'") from None


@app.command()
def send(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step waiting for input (human.input).", show_default=False)],
    value: Annotated[str, typer.Option("--value", metavar="JSON", help="The value, as JSON (a string in quotes).",
                                       show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Give a value to a step waiting for input; a value its schema refuses is not sent (exit 2), the step waits."""
    with _clean_errors():
        url = journal or default_journal_url()
        given = parse_value(value)
        how = _reply(url, run_id, lambda opened: send_input(opened, run_id, step, given))
    typer.echo(f"sent the value to step '{step}' of run {run_id}: {how}")


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.", show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Cancel a run, also one running in another process (it stops within a second)."""
    with _clean_errors():
        url = journal or default_journal_url()
        if _journal_file_missing(url):
            raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")

        async def go() -> str:
            async with open_journal(url) as opened:
                return await request_cancel(opened, run_id)

        done = asyncio.run(go())
    if done == "requested":
        typer.echo(f"cancel requested: the process running run {run_id} stops it within a second")
    else:
        typer.echo(f"run {run_id} had no live process (it was interrupted or had failed): marked it cancelled")


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to bind (anything but 127.0.0.1 is exposed).")] =
    "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8765,
    journal: JournalOption = None,
    tools: ToolsOption = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Most steps running at once.")] =
    None,
    capacity: Annotated[
        list[str] | None, typer.Option("--capacity", metavar="NAME=N", help="Capacity of a resource (repeatable)."),
    ] = None,
    telemetry: Annotated[
        bool | None, typer.Option("--telemetry/--no-telemetry",
                                  help="OpenTelemetry spans (default: as the OTEL_* variables say)."),
    ] = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    allow_env: AllowEnvOption = None,
    root: RootOption = None,
    model: Annotated[str | None, typer.Option("--model", help="Plan goals POSTed to /runs with this model.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", metavar="URL",
                                                 help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")] = None,
    max_budget_usd: Annotated[float | None, typer.Option(
        "--max-budget-usd", min=0, help="Cap on any run's budget_usd (also its default).")] = None,
    max_budget_tokens: Annotated[int | None, typer.Option(
        "--max-budget-tokens", min=0, help="Cap on any run's budget_tokens (also its default).")] = None,
    max_deadline: Annotated[float | None, typer.Option(
        "--max-deadline", min=0, help="Cap on any run's deadline in seconds (also its default).")] = None,
    max_replans: Annotated[int | None, typer.Option(
        "--max-replans", min=0, help="Cap on any goal run's max_replans (also its default).")] = None,
) -> None:
    """Serve the HTTP API, the live event streams and the dashboard; print the URL and the access token.

    The ``--max-*`` caps bound what any ``POST /runs`` may ask for; a request without a limit gets the cap.
    """
    with _clean_errors():
        require("server", "the server")
        from planweave.server import serve as serve_forever
        from planweave.server.limits import LimitCaps

        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(root or ()), tuple(allow_env or ())))
        caps = LimitCaps(max_budget_usd, max_budget_tokens, max_deadline, max_replans)
        asyncio.run(serve_forever(host, port, journal, None, tools=toolbox, concurrency=concurrency,
                                  capacities=parse_capacities(capacity or ()), telemetry=telemetry, model=model,
                                  base_url=base_url, caps=caps))


@tools_app.command("list")
def tools_list(
    tools: ToolsOption = None,
    mcp: Annotated[list[str] | None, typer.Option("--mcp", metavar="NAME=COMMAND_OR_URL",
                                                  help="Also list this MCP server's tools (repeatable).")] = None,
    json_output: JsonOption = False,
) -> None:
    """List the tools a plan can call: name, description and argument schema."""
    with _clean_errors():
        toolbox = load_tools(tools or ())

        async def collect() -> list[dict[str, Any]]:
            async with AsyncExitStack() as stack:
                box = await open_mcp(stack, tuple(mcp or ()), toolbox)
                return [{"name": t.name, "description": t.description, "input_schema": dict(t.input_schema),
                         "idempotent": t.idempotent} for t in sorted(box.values(), key=lambda t: t.name)]

        listed = asyncio.run(collect())
    if json_output:
        _print_json(listed)
        return
    console = Console(highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("tool", "arguments", "description"):
        table.add_column(column)
    for item in listed:
        props = item["input_schema"].get("properties", {})
        required = set(item["input_schema"].get("required", []))
        args = ", ".join(f"{k}{'' if k in required else '?'}" for k in props) or "(any)"
        desc = (item["description"] or "").strip().splitlines()
        table.add_row(item["name"], args, desc[0] if desc else "")
    console.print(table)


@bench_app.command("asynchow")
def bench_asynchow(
    directory: Annotated[Path, typer.Argument(help="The AsyncHow data set directory.", show_default=False)],
    json_output: JsonOption = False,
) -> None:
    """Run every AsyncHow plan on the virtual clock and count the makespans inside the gold interval."""
    try:
        from planweave.bench.asynchow import run_asynchow
    except ImportError as exc:
        typer.echo(f"error: the AsyncHow benchmark is not available: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    with _clean_errors():
        result = run_asynchow(directory)
    if json_output:
        _print_json(result)
        return
    total = int(result.get("total", 0))
    exact = int(result.get("exact", 0))
    mismatches = result.get("mismatches", [])
    n_mismatches = len(mismatches) if isinstance(mismatches, Sized) else int(mismatches)
    share = f" ({100.0 * exact / total:.1f}%)" if total else ""
    seconds = float(result.get("seconds", 0.0))
    typer.echo(f"asynchow: {exact}/{total} makespans inside the gold interval{share}, {n_mismatches} mismatches, "
               f"{seconds:.2f}s")


@bench_app.command(
    "planning",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_planning(ctx: typer.Context) -> None:
    """Streaming admission and concurrent re-planning vs whole-plan, synchronous and ReAct (options: --help)."""
    from planweave.bench.planning import main as planning_main

    raise typer.Exit(planning_main(list(ctx.args)))


@bench_app.command(
    "engine",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_engine(ctx: typer.Context) -> None:
    """Measure engine overhead; every option (--json, --help, ...) goes to planweave.bench.engine."""
    try:
        # By name: the benchmark module is optional, and imported only when asked for (it is heavier).
        module = importlib.import_module("planweave.bench.engine")
    except ImportError as exc:
        typer.echo(f"error: the engine benchmark is not available: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    bench_main: Callable[[list[str]], int] = module.main
    raise typer.Exit(bench_main(list(ctx.args)))


def main() -> None:
    """The ``planweave`` console entry point: the process ends as soon as the command is done.

    Also when tools left threads running: by then the journal is closed and the output written.
    """
    # With --json, stdout holds one JSON object whatever happens: also when the command line itself is refused
    # (an unknown option, a value of the wrong type), which Typer reports on stderr before any command runs.
    stderr = _StderrTail(sys.stderr) if "--json" in sys.argv[1:] else None
    if stderr is not None:
        sys.stderr = stderr
    try:
        app(prog_name="planweave")
    except SystemExit as exc:
        if stderr is not None and not _JSON_PRINTED and exc.code not in (0, None):
            _print_json({"status": "error", "error": stderr.message() or f"exit code {exc.code}"})
        _exit(exc.code)


class _StderrTail:
    """A stderr that also keeps the last few KiB written to it: the text of an error Typer printed."""

    _KEEP = 4096
    _FRAME = str.maketrans("", "", "╭╮╰╯─│")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._tail = ""

    def write(self, text: str) -> int:
        self._tail = (self._tail + text)[-self._KEEP:]
        return int(self._stream.write(text))

    def message(self) -> str:
        """The error as one line: the usage error's panel without its frame, or the last thing printed."""
        lines = [" ".join(line.translate(self._FRAME).split()) for line in self._tail.splitlines()]
        lines = [line for line in lines if line]
        if "Error" in lines:
            lines = lines[lines.index("Error") + 1:]
        return " ".join(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _exit(code: str | int | None) -> NoReturn:
    """Exit with ``code``; if threads that tools started are still running, without waiting for them.

    The interpreter joins every non-daemon thread before it exits, and ``concurrent.futures`` pools a tool created
    join their workers: a tool that left one behind would keep the process alive after its run ended. Rather than
    wait, print what is pending and end with ``os._exit``, the last resort: atexit handlers are skipped, so logging
    is shut down (flushed) here first.
    """
    lingering = [t for t in threading.enumerate() if not t.daemon and t is not threading.current_thread()]
    if not lingering:
        raise SystemExit(code)
    if isinstance(code, str):
        sys.stderr.write(code + "\n")  # what SystemExit("message") would have printed
    status = code if isinstance(code, int) else (0 if code is None else 1)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
