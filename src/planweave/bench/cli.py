"""The benchmarks' command lines, parsed with Typer like ``planweave`` itself.

A benchmark module keeps ``main(argv) -> int`` (what ``planweave bench NAME ARGS...`` forwards to, and what
``python -m planweave.bench.NAME`` runs) and writes its options as the parameters of one function, read here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer
import typer.main

from planweave.cli.help_types import show_value_types

T = TypeVar("T")

__all__ = ["parse_command_line"]


def parse_command_line(command: Callable[..., T], argv: Sequence[str] | None, prog: str) -> T:
    """Call ``command`` with the options ``argv`` gives (``sys.argv[1:]`` when None) and return what it returns.

    ``command``'s parameters are Typer options (``Annotated[..., typer.Option(...)]``) and its docstring the help.
    ``--help`` prints it and exits 0; a bad option (or a ``typer.BadParameter`` raised by ``command``) prints the
    usage error and exits 2, as SystemExit.
    """
    got: list[T] = []

    @functools.wraps(command)
    def call(*args: Any, **kwargs: Any) -> None:
        got.append(command(*args, **kwargs))

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(call)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cmd = typer.main.get_command(app)
        show_value_types(cmd)  # flags without ``<bool>``, text options named (as every planweave command)
        cmd.main(args=args, prog_name=prog, standalone_mode=True)
    except SystemExit as exc:
        if got and exc.code in (0, None):
            return got[0]
        raise
    raise AssertionError("a standalone Click command always exits")  # pragma: no cover
