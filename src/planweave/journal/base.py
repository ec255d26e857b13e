"""The journal interface: an append-only log of events plus a content-addressed store of step outputs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from planweave.engine.events import Event

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


class OutputNotSerialisable(TypeError):
    """A step's output cannot be stored as JSON."""


def encode_blob(value: Any) -> tuple[str, bytes]:
    """Return the content reference and canonical JSON bytes of an output (raises OutputNotSerialisable)."""
    try:
        data = orjson.dumps(value, option=_OPTS)
    except TypeError as exc:
        raise OutputNotSerialisable(f"output is not JSON-serialisable: {exc}") from None
    return hashlib.sha256(data).hexdigest(), data


def decode_blob(data: bytes | str) -> Any:
    return orjson.loads(data)


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # pydantic models (the plan in run_created) serialise as documents
    if dump is not None:
        return dump(mode="json", by_alias=True, exclude_defaults=True)
    raise TypeError(f"cannot store {type(value).__name__} in the journal")


def encode_data(data: Any) -> bytes:
    """Serialise an event's data (called by journals in their writer, off the engine's hot path)."""
    return orjson.dumps(data, default=_default, option=orjson.OPT_NON_STR_KEYS)


class Journal(Protocol):
    """Where runs are recorded. ``append`` and ``put_blob`` buffer; ``flush`` makes everything buffered durable.

    Implementations: :mod:`planweave.journal.memory`, :mod:`planweave.journal.sqlite`,
    :mod:`planweave.journal.postgres`; all pass ``tests/journal/test_conformance.py``.
    """

    durable: bool
    url: str

    def append(self, event: Event) -> None:
        """Buffer an event; it gets its ``pos`` when it is stored, in append order."""
        ...

    def put_blob(self, value: Any) -> str:
        """Buffer an output and return its content reference (raises OutputNotSerialisable)."""
        ...

    async def flush(self) -> None:
        """Return once every event and blob buffered so far is stored (durably, for durable journals)."""
        ...

    async def read(self, run_id: str | None = None, after: int = 0, kind: str | None = None) -> list[Event]:
        """Stored events with ``pos > after`` in order, of one run or (``None``) of all runs; only of ``kind``
        if given."""
        ...

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        """The outputs stored under ``refs`` (missing ones are left out)."""
        ...

    async def run_ids(self) -> list[str]:
        """Every run in the journal, oldest first."""
        ...

    async def close(self) -> None:
        """Flush and release resources."""
        ...


class NullJournal:
    """Records nothing: for runs where even an in-memory log is not wanted (benchmarks)."""

    durable = False
    url = "null://"

    def append(self, event: Event) -> None:
        pass

    def put_blob(self, value: Any) -> str:
        return ""

    async def flush(self) -> None:
        pass

    async def read(self, run_id: str | None = None, after: int = 0, kind: str | None = None) -> list[Event]:
        return []

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return {}

    async def run_ids(self) -> list[str]:
        return []

    async def close(self) -> None:
        pass
