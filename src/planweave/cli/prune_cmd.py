"""``planweave prune``: retention, removing the events and outputs of runs that ended long ago."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Annotated

import typer

from planweave.cli.common import JournalOption, JsonOption, UsageError, clean_errors, journal_file_missing, print_json
from planweave.journal import default_journal_url, open_journal
from planweave.journal.summary import PRUNABLE, PRUNE_DEFAULT, PruneResult


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"


async def _prune(url: str, before: float, statuses: frozenset[str]) -> PruneResult:
    async with open_journal(url) as journal:
        return await journal.prune(before, statuses)


def prune(
    older_than: Annotated[float, typer.Option("--older-than", metavar="DAYS", min=0, help=(
        "Remove runs that ended more than DAYS days ago (fractions allowed: 0.5 is twelve hours)."))],
    status: Annotated[list[str] | None, typer.Option("--status", metavar="STATUS", help=(
        "Only runs that ended in this status (repeatable or comma-separated): succeeded, cancelled, failed. "
        "Default: succeeded and cancelled; a failed run can still be resumed, so it goes only when named."))] = None,
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Remove the events, summaries and outputs (those no remaining run uses) of runs that ended long ago, and say
    how much space that freed. A running or interrupted run is never removed.
    """
    with clean_errors(json_output):
        url = journal or default_journal_url()
        statuses = PRUNE_DEFAULT if status is None else frozenset(
            s.strip() for item in status for s in item.split(",") if s.strip())
        wrong = sorted(statuses - PRUNABLE)
        if wrong or not statuses:
            raise UsageError(f"--status {','.join(wrong) or '(none)'}: prune removes ended runs only; use "
                             f"{', '.join(sorted(PRUNABLE))}")
        if journal_file_missing(url):
            raise UsageError(f"no journal at {url}: nothing to prune")
        result = asyncio.run(_prune(url, time.time() - older_than * 86400.0, statuses))
    if json_output:
        print_json(dataclasses.asdict(result))
        return
    line = (f"pruned {len(result.runs):,} run{'' if len(result.runs) == 1 else 's'} ended over {older_than:g} days "
            f"ago ({', '.join(sorted(statuses))}): {result.events:,} events and {result.outputs:,} outputs, "
            f"{_size(result.bytes_freed)} of data")
    if result.file_bytes_freed is not None:
        line += f"; the journal file is {_size(max(0, result.file_bytes_freed))} smaller"
    typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``prune`` to ``app``."""
    app.command()(prune)
