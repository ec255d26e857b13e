"""What each option of a ``planweave`` command takes, as its ``--help`` shows it.

Typer labels every option with its Python annotation: a flag reads ``--json <bool>`` as if it took a value, and a
text option ``--run-id <str>``, which says nothing. :class:`TypedHelpGroup` (the app's group class) fixes both once for
every command, as git and argparse print them: a flag shows no value (``--json``), a text option without a ``metavar``
of its own shows its name (``--run-id RUN_ID``); numbers, paths and choices keep their real types (``<int>``,
``<path>``, ``<off|safe|eager>``). ``tests/cli/test_help_types.py`` checks every command's ``--help``.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

__all__ = ["TypedHelpGroup", "show_value_types"]

_GENERIC = ("<str>", "<list[str]>")


class _NamedArgument(TyperArgument):
    """An argument whose name says what it is (``run_id``): no generic ``<str>`` beside it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        shown = super().display_type_rich(ctx)
        return None if shown in _GENERIC else shown


def _typed(param: Any, ctx: Any) -> None:
    if type(param) is TyperArgument:
        param.__class__ = _NamedArgument  # same state, one method more specific: Typer builds the objects
    if not isinstance(param, TyperOption) or param.metavar is not None:
        return
    if param.is_flag or param.count:
        param.metavar = ""  # takes no value: nothing to show
    elif param.display_type(ctx) in _GENERIC and param.name:
        param.metavar = param.name.upper()


def show_value_types(command: Any) -> None:
    """Give ``command`` (and its subcommands) the value labels described above, ``--help`` included."""
    ctx = typer.Context(command)
    for param in command.params:
        _typed(param, ctx)
    help_option = command.get_help_option(ctx)  # built once and kept by the command
    if help_option is not None:
        _typed(help_option, ctx)
    for sub in getattr(command, "commands", {}).values():
        show_value_types(sub)


class TypedHelpGroup(TyperGroup):
    """The ``planweave`` group: its commands' options labelled by what they take (:func:`show_value_types`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        show_value_types(self)
