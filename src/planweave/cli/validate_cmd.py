"""``planweave validate``: check plan files without running them, every problem at once, each at its line.

A file's schema problems (each step read on its own: one invalid step does not hide the next) and its semantic
problems (``validate_plan``'s passes: unknown tools and steps, arguments a tool refuses, cycles, claims) come in one
report, in the order of the file, each placed at the line and column of the step or field it concerns
(:func:`planweave.planfile.check_plan_file`). The catalog is the built-in tools plus ``--tools``, as for ``run``.

Exit status: 0 when every file is valid, 1 when one has problems, 2 when a file cannot be read (missing, a
directory, too large) or ``--tools`` cannot be imported: the worst over the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.cli.common import ExitCode, JsonOption, ToolsOption, clean_errors, load_tools, print_json
from planweave.core.errors import PlanProblem
from planweave.planfile import PlanFileCheck, check_plan_file


def _problem_document(problem: PlanProblem) -> dict[str, Any]:
    return {"step": problem.step, "field": problem.field, "line": problem.line, "column": problem.column,
            "message": problem.detail}


def check_document(check: PlanFileCheck) -> dict[str, Any]:
    """One file's ``--json`` object: ``{file, valid, problems: [{step, field, line, column, message}]}``."""
    return {"file": check.source, "valid": check.valid,
            "problems": [_problem_document(problem) for problem in check.problems]}


def check_lines(check: PlanFileCheck) -> list[str]:
    """One file's report for people: ``FILE:LINE:COLUMN: step 'id', field: message`` per problem (as compilers
    write them, for editors to jump to), then ``FILE: valid (N steps)`` or ``FILE: N problems``."""
    lines = []
    for problem in check.problems:
        where = check.source
        if problem.line is not None:
            where += f":{problem.line}" + (f":{problem.column}" if problem.column is not None else "")
        lines.append(f"{where}: {problem.unplaced()}")
    if check.valid:
        lines.append(f"{check.source}: valid ({check.steps} step{'' if check.steps == 1 else 's'})")
    elif check.readable:
        count = len(check.problems)
        lines.append(f"{check.source}: {count} problem{'' if count == 1 else 's'}")
    return lines


def exit_code(checks: list[PlanFileCheck]) -> ExitCode:
    """The worst over the files: a file not read (2), a file with problems (1), else 0."""
    if any(not check.readable for check in checks):
        return ExitCode.BAD_INPUT
    return ExitCode.SUCCEEDED if all(check.valid for check in checks) else ExitCode.FAILED


def validate(
    plans: Annotated[list[Path], typer.Argument(metavar="PLAN", help="Plan files (YAML or JSON) to check.",
                                                show_default=False)],
    tools: ToolsOption = None,
    json_output: JsonOption = False,
) -> None:
    """Check plan files without running them: every problem at once (schema and semantic), each at its line and
    column. Exit 0 if every file is valid, 1 if one has problems, 2 if one cannot be read.

    --json: {file, valid, problems: [{step, field, line, column, message}]}; for several files {valid, files}.
    """
    with clean_errors(json_output):
        catalog = load_tools(tools or ())  # a --tools that cannot be imported: exit 2, as for run
    checks = [check_plan_file(path, catalog) for path in plans]
    if json_output:
        documents = [check_document(check) for check in checks]
        print_json(documents[0] if len(documents) == 1 else
                   {"valid": all(check.valid for check in checks), "files": documents})
    else:
        for check in checks:
            for line in check_lines(check):
                typer.echo(line)
    raise typer.Exit(exit_code(checks))


def register(app: typer.Typer) -> None:
    """Add ``validate`` to ``app``."""
    app.command()(validate)
