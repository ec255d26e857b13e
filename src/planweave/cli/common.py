"""What every ``planweave`` command shares: exit codes, errors printed without a traceback, ``--json``
printing, the common options and loading tools."""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.core.errors import JournalError, PlanInvalid, PlanweaveError, RunError
from planweave.extras import require
from planweave.journal import default_journal_url, redact_url
from planweave.tools import Tool, Toolbox, builtin_tools
from planweave.tools.safety import redact, secret_values


class ExitCode(IntEnum):
    """What a ``planweave`` process exit status means."""

    SUCCEEDED = 0
    FAILED = 1  # the run failed or was cancelled
    BAD_INPUT = 2  # invalid plan, unknown run, bad option: nothing was run
    INTERRUPTED = 130  # SIGINT/SIGTERM: the run is left resumable (128 + SIGINT, as shells report it)


class UsageError(PlanweaveError):
    """A command-line argument that cannot be used (a malformed ``--capacity``, an unimportable ``--tools``)."""


def journal_file_missing(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist (reading it must not create it)."""
    if not url.startswith("sqlite:"):
        return False
    from planweave.journal.sqlite import path_of

    path = path_of(url)
    return path != ":memory:" and not Path(path).exists()


def shown_redaction() -> Callable[[Any], Any] | None:
    """What hides this process's secrets (``tools.safety.secret_values``) in everything shown; None if none."""
    secrets = secret_values()
    return functools.partial(redact, secrets=secrets) if secrets else None


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
            box = box.merged(_without_builtins(box, _as_toolbox(target, spec)))
        except ValueError as exc:
            raise UsageError(f"--tools {spec}: {exc} (name yours differently)") from None
    return box


def _without_builtins(base: Toolbox, user: Toolbox) -> Toolbox:
    """``user``'s tools less the built-ins ``base`` already has: a module that starts from ``builtin_tools()`` (as
    the README's example does) merges with the command's own built-ins, whose ``shell`` and file tools are the ones
    confined by ``--workdir``/``--allow-exec``/``--root`` and must stay so."""
    from planweave.tools.builtins import is_builtin

    return user.without(name for name, t in user.items() if name in base and is_builtin(t))


# -- running ---------------------------------------------------------------------------------------------------


async def open_mcp(stack: AsyncExitStack, flags: Sequence[str], tools: Toolbox) -> Toolbox:
    """Connect the ``--mcp NAME=SPEC`` servers (for the life of ``stack``) and add their tools to ``tools``."""
    if not flags:
        return tools
    require("mcp", "--mcp (MCP servers)")
    from planweave.tools.mcp import MCPServer, connect_mcp  # the mcp SDK takes a second to import

    servers = [MCPServer.parse(flag) for flag in flags]
    return tools.merged(await stack.enter_async_context(connect_mcp(servers)))


JSON_PRINTED: list[bool] = []  # not empty once a --json command printed its object (main() checks it)


def print_json(value: Any) -> None:
    JSON_PRINTED.append(True)
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
            {"step": p.step, "field": p.field, "message": p.message, "line": p.line, "column": p.column,
             "text": str(p)} for p in problems]}
    return {"status": "error", "error": "; ".join(str(e) for e in errors)}


def _placed(error: PlanweaveError) -> PlanweaveError:
    """A plan file's problems placed at their lines (those found after it was read name only their step)."""
    if not isinstance(error, PlanInvalid):
        return error
    from planweave.planfile import placed_in_source

    return placed_in_source(error)


@contextmanager
def clean_errors(json_output: bool = False) -> Iterator[None]:
    """Print planweave errors as their message on stderr and exit 2: people see no traceback for them.

    With ``json_output`` stdout gets their :func:`_error_document` too: ``--json`` always prints one object.
    """
    try:
        yield
    except Exception as exc:
        errors = _plain_errors(exc)
        if errors is None:
            raise
        errors = [_placed(error) for error in errors]
        for error in errors:
            typer.echo(str(error) if isinstance(error, PlanInvalid) else f"error: {error}", err=True)
        if json_output:
            print_json(_error_document(errors))
        raise typer.Exit(ExitCode.BAD_INPUT) from None


#: The panels of a command's --help the shared options are grouped in.
PANEL_OUTPUT = "Journal and output"
PANEL_SCHEDULING = "Scheduling"
PANEL_TOOLS = "Tools and confinement"
PANEL_MODEL = "Model, goal and limits"

JournalOption = Annotated[
    str | None,
    typer.Option("--journal", rich_help_panel=PANEL_OUTPUT, metavar="URL",
                 help="Journal URL (sqlite:///path.db, postgresql://..., memory://); default $PLANWEAVE_JOURNAL "
                      "or sqlite:///.planweave/runs.db."),
]
# The server-wide caps of `serve` and `mcp` (server/limits.LimitCaps): a request above one is refused, one without
# a value gets it.
MaxBudgetUsdOption = Annotated[float | None, typer.Option(
    "--max-budget-usd", min=0, help="Cap on any run's budget_usd (also its default).")]
MaxBudgetTokensOption = Annotated[int | None, typer.Option(
    "--max-budget-tokens", min=0, help="Cap on any run's budget_tokens (also its default).")]
MaxDeadlineOption = Annotated[float | None, typer.Option(
    "--max-deadline", min=0, help="Cap on any run's deadline in seconds (also its default).")]
MaxReplansCapOption = Annotated[int | None, typer.Option(
    "--max-replans", min=0, help="Cap on any goal run's max_replans (also its default).")]
JsonOption = Annotated[bool, typer.Option("--json", rich_help_panel=PANEL_OUTPUT,
                                          help="Print one JSON object on stdout and nothing else.")]
ToolsOption = Annotated[
    list[str] | None,
    typer.Option("--tools", rich_help_panel=PANEL_TOOLS, metavar="MODULE:ATTR",
                 help="Also use these tools: a Toolbox, a list of tools or a function returning one (repeatable)."),
]
VirtualOption = Annotated[
    bool, typer.Option("--virtual-clock", rich_help_panel=PANEL_OUTPUT,
                       help="Run on virtual time: sleeps and timeouts take no real time."),
]


WorkdirOption = Annotated[
    Path, typer.Option("--workdir", rich_help_panel=PANEL_TOOLS,
                       help="The shell tool's jail: its cwd must stay inside (default: here).")]
AllowExecOption = Annotated[
    list[str] | None,
    typer.Option("--allow-exec", rich_help_panel=PANEL_TOOLS,
                 metavar="PROGRAM", help="Only these programs may run in shell steps (repeatable)."),
]

NoCacheOption = Annotated[bool, typer.Option(
    "--no-cache", rich_help_panel=PANEL_SCHEDULING,
    help="Run every step: none reuses a cached output of a tool declared cache (their outputs are still recorded "
         "for later runs; docs/caching.md).")]


McpOption = Annotated[
    list[str] | None,
    typer.Option("--mcp", rich_help_panel=PANEL_TOOLS, metavar="NAME=COMMAND_OR_URL",
                 help="Connect an MCP server (a command over stdio, or an http(s) URL); its tools are NAME.tool "
                      "(repeatable)."),
]


def journal_flag(url: str) -> str:
    """`` --journal URL`` for commands printed for people, or nothing for the default journal."""
    return "" if url == default_journal_url() else f" --journal {redact_url(url)}"


def _finite_priority(value: float) -> float:
    if not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


PriorityOption = Annotated[float, typer.Option(
    "--priority", rich_help_panel=PANEL_MODEL, callback=_finite_priority,
    help="The run's priority for shared model endpoints: its model calls queue ahead of lower ones' (default 0; "
         "journaled, a resume keeps it; docs/admission.md).")]

def use_model_limits(path: Path, label: str = "--model-limits") -> None:
    """Read a ``--model-limits`` file and make it the process's admission for model calls (bad file: exit 2, the
    message opening with ``label``: the flag, or the config key and its file)."""
    from planweave.models.admission import load_model_limits, set_default_admission

    try:
        set_default_admission(load_model_limits(path))
    except ValueError as exc:
        raise UsageError(f"{label}: {exc}") from None
