"""``planweave approve``, ``send`` and ``cancel``: a person's answer journaled for a run, from any process.

The first reply to a waiting step is final: a later one exits 2 naming the reply that stands (docs/people.md).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import typer

from planweave.cli.common import (
    JournalOption,
    UsageError,
    clean_errors,
    journal_file_missing,
    journal_flag,
)
from planweave.core.errors import RunNotFound
from planweave.engine.runtime import (
    request_cancel,
    send_approval,
    send_input,
)
from planweave.journal import Journal, default_journal_url, open_journal


def author() -> str:
    """Who answers from this process, as the journal records it: ``user@host`` (as the user says: not proof)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _reply(url: str, run_id: str, give: Callable[[Journal], Awaitable[str]]) -> str:
    """Open the journal at ``url`` and journal a person's answer with ``give``; how it will be applied.

    Raises ReplyRefused (exit 2) when a reply already stands for the step: the first reply is final.
    """
    if journal_file_missing(url):
        raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")

    async def go() -> str:
        async with open_journal(url) as opened:
            return await give(opened)

    done = asyncio.run(go())
    if done == "applied":
        return "the process running it applies it (confirmed: the reply stands)"
    if done == "pending":
        return ("journaled as the reply that stands, but the process named as running it has not applied it yet: "
                f"`planweave show {run_id}` tells when it has")
    return f"no process runs it, so it is recorded and applies when the run resumes: planweave resume {run_id}" + \
        journal_flag(url)


def approve(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step waiting for approval.", show_default=False)],
    reject: Annotated[bool, typer.Option("--reject", help="Reject it: the step fails (kind rejected).")] = False,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="Why, for the journal.")] = None,
    journal: JournalOption = None,
) -> None:
    """Approve (or ``--reject``) a step waiting for approval, from any process sharing the run's journal.

    The first reply is final: if the step already has one, nothing is sent and this exits 2 naming it.
    """
    with clean_errors():
        url = journal or default_journal_url()
        how = _reply(url, run_id, lambda opened: send_approval(opened, run_id, step, approve=not reject,
                                                               reason=reason, by=author()))
    typer.echo(f"{'rejected' if reject else 'approved'} step '{step}' of run {run_id}: {how}")


def parse_value(text: str) -> Any:
    """The JSON of ``--value``; raises UsageError saying how to quote a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--value {text!r} is not JSON ({exc.msg}); a string needs quotes, e.g. "
                         f"--value '{json.dumps(text)}'") from None


def send(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step waiting for input (human.input).", show_default=False)],
    value: Annotated[str, typer.Option("--value", metavar="JSON", help="The value, as JSON (a string in quotes).",
                                       show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Give a value to a step waiting for input; a value its schema refuses is not sent (exit 2), the step waits.

    The first value is final: if the step already has one, nothing is sent and this exits 2 naming it.
    """
    with clean_errors():
        url = journal or default_journal_url()
        given = parse_value(value)
        how = _reply(url, run_id, lambda opened: send_input(opened, run_id, step, given, by=author()))
    typer.echo(f"sent the value to step '{step}' of run {run_id}: {how}")


def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.", show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Cancel a run, also one running in another process (it stops within a second)."""
    with clean_errors():
        url = journal or default_journal_url()
        if journal_file_missing(url):
            raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")

        async def go() -> str:
            async with open_journal(url) as opened:
                try:
                    return await request_cancel(opened, run_id)
                except RunNotFound:
                    if not url.startswith(("postgresql://", "postgres://")):
                        raise
                    from planweave.workers import cancel_queued  # a run no worker has claimed yet

                    await cancel_queued(url, run_id)
                    return "dequeued"

        done = asyncio.run(go())
    if done == "dequeued":
        typer.echo(f"run {run_id} was still queued: no worker will run it")
    elif done == "requested":
        typer.echo(f"cancel requested: the process running run {run_id} stops it within a second")
    else:
        typer.echo(f"run {run_id} had no live process (it was interrupted or had failed): marked it cancelled")


def register(app: typer.Typer) -> None:
    """Add ``approve``, ``send``, ``cancel`` to ``app``."""
    for command in (approve, send, cancel):
        app.command()(command)
