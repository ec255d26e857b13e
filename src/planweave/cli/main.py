"""The ``planweave`` command: run, resume, inspect and cancel plans on a journal, and run the benchmarks.

This is planweave's only synchronous edge: each command runs one coroutine with ``asyncio.run`` (or
:func:`~planweave.core.clock.run_virtual`) and turns how it ended into output and an exit code (:class:`ExitCode`).
``--json`` output is exactly one JSON document on stdout; everything meant for people goes to stderr then.

The commands live in one module per group; this module only builds the app from them and runs it:

- :mod:`planweave.cli.common`: exit codes, :class:`UsageError`, ``clean_errors`` (planweave errors printed without a
  traceback, exit 2), ``print_json``, the shared ``Annotated`` options (``JournalOption``, ``JsonOption``, ...) and
  loading tools;
- :mod:`~planweave.cli.run_cmd` ``run``/``resume`` (on :mod:`~planweave.cli.follow`, which runs one run live),
  :mod:`~planweave.cli.inspect_cmd` ``runs``/``show``/``output``, :mod:`~planweave.cli.reply_cmd`
  ``approve``/``send``/``cancel``, :mod:`~planweave.cli.serve_cmd` ``serve``, :mod:`~planweave.cli.tools_cmd`
  ``tools ...``, :mod:`~planweave.cli.bench_cmd` ``bench ...``.

**Adding a command group** (one way): write ``planweave/cli/<group>_cmd.py`` with the commands as plain functions
(options from :mod:`planweave.cli.common`, the body inside ``with clean_errors(json_output):``) and a
``register(app: typer.Typer) -> None`` that adds them (``app.command()(worker)``, or ``app.add_typer(...)`` for a
sub-group), then add one line to :data:`COMMAND_GROUPS` below naming the module and its top-level command names
(they must be right: :func:`main` imports and builds only the group of the command it runs, for start-up time).
A group module imports ``planweave.cli.common`` (and ``follow``), never this module (``tests/test_architecture.py``).
A new flag on ``run`` is a parameter of :func:`planweave.cli.run_cmd.run` plus the field of the option group it
belongs to (:class:`~planweave.cli.run_cmd.ModelFlags` for the model and its limits,
:class:`~planweave.cli.follow.Session` for where and how the engine runs).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer._click.core import Context as ClickContext  # Typer vendors Click: its context and usage error
from typer._click.exceptions import UsageError as CommandLineError

from planweave import __version__
from planweave.cli.common import JSON_PRINTED, ExitCode, UsageError, print_json
from planweave.cli.help_types import TypedHelpGroup

if TYPE_CHECKING:
    from planweave.cli.inspect_cmd import JournaledRun, read_run, read_runs

    app: typer.Typer  # built on first use (:func:`__getattr__`)

__all__ = ["COMMAND_GROUPS", "ExitCode", "JournaledRun", "UsageError", "app", "build_app", "main", "read_run",
           "read_runs"]

# Each command group: its module (with ``register(app)``) and the top-level command names it adds.
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "planweave.cli.run_cmd": ("run", "goal", "resume"),
    "planweave.cli.inspect_cmd": ("runs", "show", "output"),
    "planweave.cli.prune_cmd": ("prune",),
    "planweave.cli.reply_cmd": ("approve", "send", "cancel"),
    "planweave.cli.serve_cmd": ("serve",),
    "planweave.cli.tools_cmd": ("tools",),
    "planweave.cli.bench_cmd": ("bench",),
    "planweave.cli.workers_cmd": ("submit", "worker", "workers"),
    "planweave.cli.forecast_cmd": ("estimates", "forecast"),
    "planweave.cli.rollouts_cmd": ("rollouts",),
    "planweave.cli.control_cmd": ("control",),
    "planweave.cli.memory_cmd": ("memory",),
    "planweave.cli.validate_cmd": ("validate",),
    "planweave.cli.mcp_cmd": ("mcp",),
}


def _version(value: bool) -> None:
    if value:
        from planweave.engine import COMPILED

        typer.echo(f"planweave {__version__} ({'engine compiled with mypyc' if COMPILED else 'pure Python'})")
        raise typer.Exit()


def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Plan long-horizon agent tasks as DAGs and run them event-driven on a durable journal."""


def build_app(command: str | None = None) -> typer.Typer:
    """The ``planweave`` app with every group of :data:`COMMAND_GROUPS` registered, or only the group that adds
    ``command`` (what :func:`main` runs: the other groups are neither imported nor built into Click commands)."""
    built = typer.Typer(
        name="planweave",
        help="Plan long-horizon agent tasks as DAGs and run them event-driven on a durable journal.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=PlanweaveGroup,
    )
    built.callback()(root)
    only = [module for module, names in COMMAND_GROUPS.items() if command in names]
    for module in only or COMMAND_GROUPS:
        importlib.import_module(module).register(built)
    return built


GOAL_ALIAS_NOTE = "note: `planweave run --goal TEXT` is spelled `planweave goal TEXT` now; running that"


def forward_goal_alias(args: Sequence[str]) -> list[str]:
    """``run ... --goal TEXT ...`` (the spelling before ``goal`` had its own command) as ``goal ... -- TEXT``, with a
    one-line note on stderr; any other command line as it is."""
    args = list(args)
    if not args or args[0] != "run":
        return args
    rest = args[1:]
    for i, arg in enumerate(rest):
        if arg == "--":
            break
        if arg == "--goal" and i + 1 < len(rest):
            text, others = rest[i + 1], rest[:i] + rest[i + 2:]
        elif arg.startswith("--goal="):
            text, others = arg.removeprefix("--goal="), rest[:i] + rest[i + 1:]
        else:
            continue
        sys.stderr.write(GOAL_ALIAS_NOTE + "\n")
        return ["goal", *others, "--", text]
    return args


MOVED_FLAGS: dict[str, str] = {
    "--tiers": "tiers=FILE", "--cascade": "cascade=true", "--speculate": "speculate=MODE",
    "--predictor-model": "predictor_model=NAME", "--executor": "executor=KIND", "--ray-address": "ray_address=ADDR",
    "--no-cache": "cache=false", "--allow-env": "'allow_env=[\"NAME\"]'", "--root": "'roots=[\"DIR\"]'",
    "--api-key-env": "api_key_env=NAME", "--header": "'headers=[\"NAME: VALUE\"]'",
    "--model-limits": "model_limits=FILE", "--prices": "prices=FILE", "--priority": "priority=N",
    "--forecast": "forecast=true", "--deadline-pressure": "deadline_pressure=P", "--draft-model": "draft_model=NAME",
    "--memory-model": "memory_model=NAME", "--memory-embed": "memory_embed=true", "--context": "context=MODE",
    "--no-subplans": "subplans=false", "--plan-max-tokens": "plan_max_tokens=N", "--port": "port=N",
    "--request-timeout": "request_timeout=S", "--max-connections": "max_connections=N", "--capacity": "capacities",
}
"""Options that became keys of the run configuration (``--config``): used on a command that no longer takes them,
they exit 2 saying the key (docs/cli.md)."""


def refuse_moved_flags(command: Any, name: str, args: Sequence[str]) -> None:
    """Exit 2 (a usage error) for an option of :data:`MOVED_FLAGS` that ``command`` does not take, naming the
    ``--config`` key that replaced it."""
    own = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for arg in args:
        if arg == "--":
            return
        flag = arg.partition("=")[0]
        if flag in MOVED_FLAGS and flag not in own:
            key = MOVED_FLAGS[flag]
            how = ("--config 'capacities={NAME = N}'" if key == "capacities" else f"--config {key}")
            raise CommandLineError(f"{flag} is a key of the run configuration for planweave {name}: give {how}, or "
                                   f"write it in a --config file (docs/cli.md)")


class PlanweaveGroup(TypedHelpGroup):
    """The ``planweave`` group: typed option help (:class:`TypedHelpGroup`), the ``run --goal`` alias, and a clear
    error for an option that moved to the run configuration."""

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        args = forward_goal_alias(args)
        command = self.commands.get(args[0]) if args else None
        if command is not None and "--help" not in args:
            refuse_moved_flags(command, args[0], args[1:])
        return super().parse_args(ctx, args)


def command_of(argv: Sequence[str]) -> str | None:
    """The command a ``planweave`` command line names (its first argument that is not an option), or None."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


_LAZY = {"JournaledRun": "planweave.cli.inspect_cmd", "read_run": "planweave.cli.inspect_cmd",
         "read_runs": "planweave.cli.inspect_cmd"}


def __getattr__(name: str) -> Any:
    """``app`` (every group, built once) and the names kept here for compatibility, imported when first used."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        # Only the invoked command's group is built (start-up time); help and unknown commands get every group.
        build_app(command_of(sys.argv[1:]))(prog_name="planweave")
    except SystemExit as exc:
        if stderr is not None and not JSON_PRINTED and exc.code not in (0, None):
            print_json({"status": "error", "error": stderr.message() or f"exit code {exc.code}"})
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
