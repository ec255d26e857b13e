"""``planweave memory list|show|verify|admit|retire|export``: the lessons and skills kept across runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table

from planweave.cli.common import (
    JournalOption,
    JsonOption,
    ToolsOption,
    UsageError,
    clean_errors,
    journal_file_missing,
    load_tools,
    print_json,
)
from planweave.journal import default_journal_url

T = TypeVar("T")

memory_app = typer.Typer(help="Memory across runs: lessons and skills, admitted only after verification.",
                         no_args_is_help=True)

IdArgument = Annotated[int, typer.Argument(metavar="ID", help="The entry's id (planweave memory list shows them).")]
_KINDS = ("lesson", "skill")
_STATUSES = ("candidate", "admitted", "rejected", "retired")

if TYPE_CHECKING:  # the commands import planweave.memory when they run (start-up stays light)
    from planweave.memory import EntryKind, EntryStatus, MemoryEntry, MemoryStore


def register(app: typer.Typer) -> None:
    """Add the ``memory`` group to ``app``."""
    app.add_typer(memory_app, name="memory")


def _url(journal: str | None) -> str:
    url = journal or default_journal_url()
    if journal_file_missing(url):
        raise UsageError(f"no journal at {url}: it has no memory yet (a --goal run with --memory writes it)")
    return url


def _with_store(url: str, use: Callable[[MemoryStore], Awaitable[T]]) -> T:
    from planweave.memory import open_memory_store

    async def go() -> T:
        async with open_memory_store(url) as store:
            return await use(store)

    return asyncio.run(go())


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _one_of(flag: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise UsageError(f"{flag} {value}: use one of {', '.join(allowed)}")
    return value


@memory_app.command("list")
def memory_list(
    status: Annotated[str | None, typer.Option("--status", help="Only entries in this status: candidate, "
                                               "admitted, rejected, retired.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only lessons or only skills.")] = None,
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """List the memory entries: id, kind, name, version, status, uses, provenance and text."""
    with clean_errors(json_output):
        wanted_status = cast("EntryStatus | None", _one_of("--status", status, _STATUSES))
        wanted_kind = cast("EntryKind | None", _one_of("--kind", kind, _KINDS))
        entries = _with_store(_url(journal), lambda s: s.entries(status=wanted_status, kind=wanted_kind))
    if json_output:
        print_json([e.to_json() for e in entries])
        return
    if not entries:
        typer.echo("no memory entries" + (f" with status {status}" if status else ""))
        return
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("id", "kind", "name", "v", "status", "uses", "from run", "created", "text"):
        table.add_column(column)
    for e in entries:
        text = e.text if len(e.text) <= 60 else e.text[:57] + "..."
        table.add_row(str(e.id), e.kind, e.name, str(e.version), e.status, str(e.uses), e.run_id or "-",
                      _when(e.created_at), text)
    Console(highlight=False).print(table)


def _show(entry: MemoryEntry) -> None:
    typer.echo(f"memory {entry.id}: {entry.kind} '{entry.name}' v{entry.version}, {entry.status}"
               + (f" ({entry.note})" if entry.note else ""))
    typer.echo(f"  text: {entry.text}")
    typer.echo(f"  uses: {entry.uses}; created {_when(entry.created_at)}")
    typer.echo(f"  provenance: run {entry.run_id or '-'}, steps {', '.join(entry.step_ids) or '-'}")
    if entry.params:
        typer.echo(f"  params: {json.dumps(dict(entry.params))}")
    for step in entry.steps:
        typer.echo(f"  step: {json.dumps(dict(step))}")
    if entry.check is not None:
        typer.echo(f"  check: {json.dumps(entry.check)}")


@memory_app.command("show")
def memory_show(entry_id: IdArgument, journal: JournalOption = None, json_output: JsonOption = False) -> None:
    """Show one entry whole: text, sub-plan or check, parameters, provenance, status and why."""
    with clean_errors(json_output):
        entry = _with_store(_url(journal), lambda s: s.get(entry_id))
    if json_output:
        print_json(entry.to_json())
    else:
        _show(entry)


@memory_app.command("retire")
def memory_retire(
    entry_id: IdArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the entry).")] = "retired by a person",
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Retire an entry: it is kept, but never retrieved again."""
    with clean_errors(json_output):
        async def retire(store: MemoryStore) -> MemoryEntry:
            entry = await store.get(entry_id)
            if entry.status == "retired":
                raise UsageError(f"memory entry {entry_id} is already retired ({entry.note})")
            return await store.set_status(entry_id, "retired", reason)

        entry = _with_store(_url(journal), retire)
    if json_output:
        print_json(entry.to_json())
    else:
        typer.echo(f"retired memory {entry.id} ({entry.kind} '{entry.name}' v{entry.version})")


@memory_app.command("admit")
def memory_admit(
    entry_id: IdArgument,
    by: Annotated[str, typer.Option("--by", help="Who approves it (kept with the entry).")] = "a person",
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Admit a lesson that has no check step, on a person's approval (skills and checked lessons are admitted only
    by `planweave memory verify`)."""
    with clean_errors(json_output):
        from planweave.memory.verify import admit_by_person

        entry = _with_store(_url(journal), lambda s: admit_by_person(s, entry_id, by))
    if json_output:
        print_json(entry.to_json())
    else:
        typer.echo(f"admitted memory {entry.id} ({entry.kind} '{entry.name}' v{entry.version}): {entry.note}")


@memory_app.command("verify")
def memory_verify(
    entry_id: IdArgument,
    tools: ToolsOption = None,
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Verify a candidate: replay a skill's sub-plan with its recorded parameters, or run a lesson's check step, as
    a run in the journal; it is admitted if that run succeeds, rejected (kept, never retrieved) if not."""
    with clean_errors(json_output):
        from planweave import open_engine
        from planweave.memory import open_memory_store
        from planweave.memory.verify import verify

        url = _url(journal)
        toolbox = load_tools(tools or ())

        async def go() -> MemoryEntry:
            async with open_memory_store(url) as store, open_engine(url, tools=toolbox) as engine:
                return await verify(engine, store, await store.get(entry_id), tools=toolbox)

        entry = asyncio.run(go())
    if json_output:
        print_json(entry.to_json())
    else:
        typer.echo(f"memory {entry.id} ({entry.kind} '{entry.name}' v{entry.version}): {entry.status}"
                   + (f" — {entry.note}" if entry.note else " — a lesson without a check: planweave memory admit "
                      f"{entry.id} after reading it"))
    if entry.status == "rejected":  # exit 1, like a failed run: the replay or check failed
        raise typer.Exit(1)


@memory_app.command("export")
def memory_export(
    status: Annotated[str | None, typer.Option("--status", help="Only entries in this status (default: all).")
                      ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")
                      ] = None,
    journal: JournalOption = None,
) -> None:
    """Export entries as JSON Lines (one entry per line, with provenance, versions and use counts)."""
    with clean_errors():
        wanted = cast("EntryStatus | None", _one_of("--status", status, _STATUSES))
        entries = _with_store(_url(journal), lambda s: s.entries(status=wanted))
    lines = "".join(json.dumps(e.to_json(), sort_keys=True) + "\n" for e in entries)
    if output is None:
        typer.echo(lines, nl=False)
    else:
        output.write_text(lines, encoding="utf-8")
        typer.echo(f"exported {len(entries)} memory entries to {output}", err=True)
