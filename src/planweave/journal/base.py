"""The journal interface: an append-only log of events plus a content-addressed store of step outputs."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from planweave.core.errors import EventNotRecorded
from planweave.core.events import Event
from planweave.core.replies import reply_events, standing_reply
from planweave.journal.summary import ALL_RUNS, PRUNE_DEFAULT, PruneResult, RunPage, RunQuery, check_prunable

if TYPE_CHECKING:
    from planweave.core.state import RunState

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
_EVENT_OPTS = orjson.OPT_NON_STR_KEYS
# orjson refuses integers beyond 64 bits (values and keys) and reads them back as floats: a value orjson refuses
# but that holds nothing JSON cannot carry takes the stdlib json path, and any document with a run of 19+ digits is
# decoded by the stdlib too (a digit run inside a string only costs a slower, still exact, decode).
_LONG_DIGITS = re.compile(rb"\d{19}")
_LONG_DIGITS_STR = re.compile(r"\d{19}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = frozenset({str, int, bool, type(None)})  # canonical as they are, and never hold a NaN
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class OutputNotSerialisable(TypeError):
    """A step's output cannot be stored as JSON exactly (the message says where inside the value and why)."""


class Unrepresentable(ValueError):
    """A value holds something JSON cannot carry exactly; ``path`` locates it (``[2].x``), ``reason`` says what."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}" if path else reason)
        self.path = path
        self.reason = reason


class EncodedOutput(NamedTuple):
    """An output in the journal's canonical form: its content reference, its JSON bytes and the decoded value."""

    ref: str
    data: bytes
    value: Any


def encode_blob(value: Any) -> tuple[str, bytes]:
    """Return the content reference and canonical JSON bytes of an output (raises OutputNotSerialisable).

    Canonical: keys sorted and turned into strings, tuples into lists, integers of any size kept exactly; NaN,
    ±Infinity, lone surrogates and types JSON has no form for are refused, naming the place inside the value.
    An :class:`EncodedOutput` (from :func:`canonical_output`) is already encoded: its reference and bytes are used.
    """
    if type(value) is EncodedOutput:
        return value.ref, value.data
    data = _dump_output(value, None)
    return hashlib.sha256(data).hexdigest(), data


def canonical_output(value: Any, *, step: str, limit: int | None = None) -> EncodedOutput:
    """Normalise a step's output once: what the journal stores and what every reader (live or resumed) sees.

    Raises OutputNotSerialisable naming ``step`` when the value cannot be stored exactly or its encoding is larger
    than ``limit`` bytes. Pass the result to ``Journal.put_blob`` to store it without encoding it again.
    """
    if value is None:
        return _NONE  # the output of most side-effect tools
    kind = type(value)
    if (kind is dict or kind is list) and not value and (limit is None or limit >= 2):
        # {} or [] (what `noop` and many side-effect tools return): known bytes and reference, a fresh container
        # as decoding would give; no encoding, hash or decode (docs/benchmarks.md, "the empty output").
        return _new_tuple(EncodedOutput, (*_EMPTY[kind], kind()))  # without the NamedTuple's Python __new__
    data = _dump_output(value, step)
    if limit is not None and len(data) > limit:
        raise OutputNotSerialisable(
            f"output of step '{step}' is {len(data):,} bytes encoded, more than the limit of {limit:,} bytes"
        )
    ref = hashlib.sha256(data).hexdigest()
    if type(value) in _SCALARS:
        return EncodedOutput(ref, data, value)  # already canonical: skip the decode
    return EncodedOutput(ref, data, decode_blob(data))


_new_tuple = tuple.__new__
_NONE = EncodedOutput(hashlib.sha256(b"null").hexdigest(), b"null", None)
_EMPTY: dict[type, tuple[str, bytes]] = {
    t: (hashlib.sha256(b).hexdigest(), b) for t, b in ((dict, b"{}"), (list, b"[]"))
}


def decode_blob(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode JSON written by :func:`encode_blob` or :func:`encode_data`, integers of any size exactly."""
    if isinstance(data, str):
        return json.loads(data) if _LONG_DIGITS_STR.search(data) else orjson.loads(data)
    if _LONG_DIGITS.search(data):
        return json.loads(bytes(data))
    return orjson.loads(data)


def scrub_text(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD; other text is unchanged."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def scrub(value: Any) -> Any:
    """``value`` with :func:`scrub_text` applied to every string in it (keys too); containers are copied."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # pydantic models (the plan in run_created) serialise as documents
    if dump is not None:
        return dump(mode="json", by_alias=True, exclude_defaults=True)
    raise TypeError(f"cannot store {type(value).__name__} in the journal")


def encode_data(data: Any) -> bytes:
    """Serialise an event's data (raises TypeError, or Unrepresentable naming the place, if it cannot be stored)."""
    try:
        return orjson.dumps(data, default=_default, option=_EVENT_OPTS)
    except TypeError:
        plain = _locate(data)  # raises Unrepresentable naming the place
    return _stdlib_dumps(plain, sort=False)  # e.g. integers beyond 64 bits


def encode_event(event: Event, url: str) -> bytes:
    """The stored bytes of ``event``'s data; raises EventNotRecorded naming the event, its run and the place.

    The run id and step id are checked too: a string that UTF-8 cannot encode would fail the whole batch.
    """
    for name, text in (("run id", event.run_id), ("step id", event.step)):
        if text is not None and not text.isascii() and _SURROGATE.search(text):
            raise EventNotRecorded(
                f"event '{event.kind}' was not recorded in the journal {url}: its {name} {text!a} holds a "
                "lone surrogate: not valid UTF-8"
            )
    try:
        return encode_data(event.data)
    except Unrepresentable as exc:
        where = f" at {exc.path} {exc.reason}" if exc.path else f" {exc.reason}"
        raise EventNotRecorded(
            f"event '{event.kind}' of run '{event.run_id}' was not recorded in the journal {url}: its data{where}"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise EventNotRecorded(
            f"event '{event.kind}' of run '{event.run_id}' was not recorded in the journal {url}: its data "
            f"is not JSON-serialisable ({exc})"
        ) from None


def _dump_output(value: Any, step: str | None) -> bytes:
    try:
        data = orjson.dumps(value, option=_OPTS)
    except TypeError:
        # Raises naming the place, unless orjson only refused integers beyond 64 bits: those the stdlib writes.
        return _stdlib_dumps(_output_plain(value, step), sort=True)
    if value is not None and b"null" in data:  # orjson writes NaN and ±Infinity as null: look only then
        _output_plain(value, step)
    return data


def _output_plain(value: Any, step: str | None) -> Any:
    what = "output" if step is None else f"output of step '{step}'"
    try:
        return _plain(value, "")
    except Unrepresentable as exc:
        where = f" at {exc.path}" if exc.path else ""
        raise OutputNotSerialisable(f"{what}{where} {exc.reason}") from None
    except RecursionError:
        raise OutputNotSerialisable(f"{what} is nested too deeply to be stored") from None


def _stdlib_dumps(plain: Any, *, sort: bool) -> bytes:
    return json.dumps(plain, sort_keys=sort, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _locate(data: Any) -> Any:
    """``data`` as plain JSON data; raises Unrepresentable for the first thing in it that cannot be stored."""
    try:
        return _plain(data, "")
    except RecursionError:
        raise Unrepresentable("", "is nested too deeply to be stored") from None


def _plain(value: Any, path: str) -> Any:
    """``value`` as plain JSON data (dicts with str keys, lists, str, int, finite float, bool, None).

    Raises Unrepresentable at the first value that JSON cannot carry exactly.
    """
    if isinstance(value, str):
        if not value.isascii() and _SURROGATE.search(value):
            raise Unrepresentable(path, f"holds a lone surrogate ({_first_surrogate(value)}): not valid UTF-8")
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            raise Unrepresentable(path, f"is {name}: not representable in JSON")
        return value
    if isinstance(value, Mapping):
        return {_key(k, path): _plain(v, _child(path, _key(k, path))) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        try:
            document = dump(mode="json", by_alias=True, exclude_defaults=True)
        except ValueError:  # pydantic cannot serialise a field: find it in the model's Python form
            document = dump(mode="python", by_alias=True, exclude_defaults=True)
        return _plain(document, path)
    try:  # types orjson knows (datetime, UUID, enum, dataclass, ...): their orjson form is canonical
        return orjson.loads(orjson.dumps(value, option=_OPTS))
    except TypeError:
        raise Unrepresentable(path, f"is a {type(value).__name__}: not JSON-serialisable") from None


def _key(key: Any, path: str) -> str:
    if isinstance(key, str):
        _plain(key, path)
        return key
    if key is None or isinstance(key, bool | int | float):
        return str(json.dumps(key))  # as orjson writes keys: true, null, 1, 1.5
    raise Unrepresentable(path, f"has a key of type {type(key).__name__}: JSON keys are strings")


def _child(path: str, key: str) -> str:
    if _NAME.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _first_surrogate(text: str) -> str:
    found = _SURROGATE.search(text)
    return f"\\u{ord(found.group()):04x}" if found else "?"


class CachedOutput(NamedTuple):
    """A finished output the journal indexed under a cache key: the run and step that produced it, when, its blob
    reference and (as :meth:`Journal.find_cached` answers it) the output itself."""

    run_id: str
    step: str
    at: float
    output: str
    value: Any = None


def cache_entries(events: Iterable[tuple[Event, bytes]]) -> list[tuple[str, CachedOutput]]:
    """The cache index rows of a batch: ``(key, entry)`` for each ``step_succeeded`` carrying a ``cache_key``.

    An output reused from the cache (``cache`` in the data) is not indexed again: its source is, and the age that
    a ttl counts is the source's.
    """
    found = []
    for event, _ in events:
        if event.kind == "step_succeeded":
            data = event.data
            key = data.get("cache_key")
            output = data.get("output")
            if isinstance(key, str) and isinstance(output, str) and "cache" not in data and event.step is not None:
                found.append((key, CachedOutput(event.run_id, event.step, event.at, output)))
    return found


async def find_cached(journal: Journal, key: str, since: float) -> CachedOutput | None:
    """``journal.find_cached(key, since)``; for a journal without that method, the same answer from its events."""
    method = getattr(journal, "find_cached", None)
    if method is not None:
        found: CachedOutput | None = await method(key, since)
        return found
    best = None
    for event in await journal.read(kind="step_succeeded"):
        for entry_key, entry in cache_entries([(event, b"")]):
            if entry_key == key and entry.at >= since and (best is None or entry.at >= best.at):
                best = entry
    if best is None:
        return None
    blobs = await journal.get_blobs([best.output])
    return best._replace(value=blobs[best.output]) if best.output in blobs else None


class ReplyWritten(NamedTuple):
    """What :meth:`Journal.append_reply` did: ``recorded`` the reply (``event`` is it, with its ``pos``), or not,
    because a reply already stands for the step (``event`` is that one)."""

    recorded: bool
    event: Event


async def append_reply(journal: Journal, event: Event) -> ReplyWritten:
    """Store ``event``, a person's ``step_reply``, unless a reply already stands for its step
    (:func:`planweave.core.replies.standing_reply` over the step's stored events).

    The memory, SQLite and PostgreSQL journals do it in their ``append_reply``: the check and the write are one
    transaction that excludes every other writer, so of two processes replying at once exactly one is recorded, and
    events buffered before the call are stored first (the run's own decisions count). A journal without that method
    (a wrapper only this process writes through) gets the same answer from its events.
    """
    method = getattr(journal, "append_reply", None)
    if method is not None:
        written: ReplyWritten = await method(event)
        return written
    standing = standing_reply(reply_events(await journal.read(event.run_id), event.step))
    if standing is not None:
        return ReplyWritten(False, standing)
    journal.append(event)
    await journal.flush()
    mine = [e for e in await journal.read(event.run_id) if e.kind == "step_reply" and e.step == event.step]
    return ReplyWritten(True, mine[-1])


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
        """Buffer an output and return its content reference (raises OutputNotSerialisable).

        An :class:`EncodedOutput` from :func:`canonical_output` is stored as it is, without encoding it again.
        """
        ...

    async def flush(self) -> None:
        """Return once every event and blob buffered so far is stored (durably, for durable journals)."""
        ...

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        """Stored events with ``pos > after`` in order, of one run or (``None``) of all runs; only of ``kind``
        if given; only the first ``limit`` of them if given (a page: read the next after the last one's ``pos``)."""
        ...

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        """The outputs stored under ``refs`` (missing ones are left out)."""
        ...

    async def run_ids(self) -> list[str]:
        """Every run in the journal, oldest first."""
        ...

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        """Keep ``run_id``'s summary from ``state`` (its live fold): summarised once per batch carrying its events.

        ``redact`` hides secrets in the summary's texts (plan name, error) as the run's events hide them. The engine
        calls this for every run it starts or resumes; a run ended in a stored batch is dropped.
        """
        ...

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        """Runs matching ``query``, newest first, from their summaries (cost: the runs returned, not the journal);
        includes what was appended before the call."""
        ...

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        """Remove the events, summaries and no longer referenced outputs of runs that ended (``run_finished``)
        before ``finished_before`` (epoch seconds) with a status in ``statuses`` (raises ValueError for a status
        that is not an ended one: a running or interrupted run is never removed). Their cache entries go with
        them, in the same transaction: an entry never names a removed output."""
        ...

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        """The newest output indexed under cache ``key`` (a ``step_succeeded`` with that ``cache_key``) produced at
        or after ``since``, with its value, among what is stored (events still buffered may be missed: a miss is
        always safe). It never waits for buffered writes: it is on the path of every cacheable step.

        The index is written in the same transaction as the event. A journal without this method is answered
        from its events by :func:`find_cached`.
        """
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

    async def read(
        self, run_id: str | None = None, after: int = 0, kind: str | None = None, limit: int | None = None
    ) -> list[Event]:
        return []

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        return {}

    async def run_ids(self) -> list[str]:
        return []

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        pass

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        return RunPage([], None)

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        check_prunable(statuses)
        return PruneResult([], 0, 0, 0)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        return None

    async def append_reply(self, event: Event) -> ReplyWritten:
        return ReplyWritten(True, event)

    async def close(self) -> None:
        pass
