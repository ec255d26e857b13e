"""Journals (adapters): where runs' events and outputs are stored. Open one by URL with :func:`open_journal`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from planweave.core.errors import JournalError
from planweave.extras import require
from planweave.journal.base import Journal, NullJournal
from planweave.journal.memory import MemoryJournal
from planweave.journal.urls import redact_url

__all__ = ["Journal", "MemoryJournal", "NullJournal", "default_journal_url", "open_journal", "redact_url"]


def default_journal_url() -> str:
    """``$PLANWEAVE_JOURNAL`` if set, else ``sqlite:///.planweave/runs.db`` under the working directory."""
    return os.environ.get("PLANWEAVE_JOURNAL") or f"sqlite:///{Path('.planweave') / 'runs.db'}"


@asynccontextmanager
async def open_journal(url: str | None = None) -> AsyncIterator[Journal]:
    """Open the journal at ``url`` (``memory://``, ``null://``, ``sqlite:///path.db``, ``postgresql://...``)."""
    url = url or default_journal_url()
    journal: Journal
    if url.startswith("memory://"):
        journal = MemoryJournal(url)
    elif url.startswith("null://"):
        journal = NullJournal()
    elif url.startswith("sqlite://"):
        from planweave.journal.sqlite import SQLiteJournal

        journal = await SQLiteJournal.open(url)
    elif url.startswith(("postgresql://", "postgres://")):
        require("postgres", "a postgresql:// journal")
        from planweave.journal.postgres import PostgresJournal

        journal = await PostgresJournal.open(url)
    else:
        raise JournalError(
            f"journal URL '{url}' is not understood: use memory://, sqlite:///path.db or postgresql://host/db"
        )
    try:
        yield journal
    finally:
        await journal.close()
