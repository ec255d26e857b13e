"""The app is built from ``COMMAND_GROUPS``; a command line builds (and imports) only the group of its command."""

from __future__ import annotations

import subprocess
import sys

import typer.core
import typer.main

from planweave.cli.main import COMMAND_GROUPS, build_app, command_of


def commands(app: typer.Typer) -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return set(group.commands)


def test_every_group_is_built_without_a_command_and_only_its_group_with_one() -> None:
    every = {name for names in COMMAND_GROUPS.values() for name in names}
    assert commands(build_app()) == every
    assert commands(build_app("run")) == {"run", "goal", "resume"}
    assert commands(build_app("goal")) == {"run", "goal", "resume"}
    assert commands(build_app("no-such-command")) == every  # Click's "No such command" then lists them all


def test_the_command_is_the_first_argument_that_is_not_an_option() -> None:
    assert command_of(["--version"]) is None
    assert command_of(["runs", "--journal", "memory://"]) == "runs"
    assert command_of([]) is None


def test_running_a_command_imports_no_other_command_group() -> None:
    code = ("import sys\nsys.argv = ['planweave', 'runs', '--journal', 'memory://']\n"
            "from planweave.cli.main import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m in " + repr(list(COMMAND_GROUPS)) + "))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines()[-1] == "planweave.cli.inspect_cmd", done.stdout
