"""Every command's ``--help`` labels an option by what it takes: a flag shows no value, a text option a name (never
Typer's ``<bool>``/``<str>``), numbers, paths and choices their types."""

from __future__ import annotations

import re
from collections.abc import Iterator

import typer.core
import typer.main
from typer.testing import CliRunner

from planweave.cli.main import build_app

PLACEHOLDERS = re.compile(r"<(bool|str|list\[str\])>")


def commands(command: typer.core.TyperCommand | typer.core.TyperGroup, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], object]]:
    """Every command of the app with its path; those without a --help of their own (``bench engine`` and the
    others that hand their arguments to a benchmark's own parser) left out."""
    if command.add_help_option:
        yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def test_every_help_shows_real_value_types() -> None:
    app = build_app()
    runner = CliRunner()
    seen = 0
    bad: dict[str, list[str]] = {}
    for path, _ in commands(typer.main.get_command(app)):  # type: ignore[arg-type]
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert shown.exit_code == 0, (path, shown.output)
        seen += 1
        lines = [line for line in shown.output.splitlines() if PLACEHOLDERS.search(line)]
        if lines:
            bad[" ".join(path) or "planweave"] = lines
    assert seen > 30
    assert bad == {}


def test_a_flag_shows_no_value_and_a_text_option_its_name() -> None:
    shown = CliRunner().invoke(build_app(), ["runs", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"│ (--[\w-]+) +(\S*)", shown.output)}
    assert rows["--json"] == "Print"  # the help text follows at once: no value between
    assert rows["--help"] == "Show"
    assert rows["--journal"] == "URL"


def test_the_benchmarks_own_help_shows_real_value_types_too() -> None:
    """``bench planning`` and the others parse their own options (bench/cli.py): their --help is labelled the same."""
    app = build_app()
    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    own = sorted(name for name, sub in bench.commands.items() if not sub.add_help_option)
    assert own, "no benchmark parses its own options"
    runner = CliRunner()
    bad: dict[str, list[str]] = {}
    for name in own:
        shown = runner.invoke(app, ["bench", name, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert shown.exit_code == 0, (name, shown.output)
        assert "--" in shown.output, (name, shown.output)
        lines = [line for line in shown.output.splitlines() if PLACEHOLDERS.search(line)]
        if lines:
            bad[name] = lines
    assert bad == {}
