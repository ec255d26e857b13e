"""The journal contract, checked against every implementation (memory, SQLite, PostgreSQL) by the same tests."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, Toolbox, builtin_tools
from planweave.core.errors import EventNotRecorded, JournalError
from planweave.core.events import Event, EventKind
from planweave.journal import open_journal
from planweave.journal import redact_url as redact
from planweave.journal.base import CachedOutput, Journal, OutputNotSerialisable, canonical_output
from planweave.journal.group_commit import GroupCommitJournal
from planweave.journal.postgres import parse_url
from planweave.journal.sqlite import SQLiteJournal, path_of
from planweave.journal.summary import PruneResult, RunQuery, fold_summary

from .conftest import Backend

T0 = 1796205146.4585145  # a realistic epoch time whose float repr has all 17 digits: must come back exactly


def ev(run: str, i: int, kind: EventKind = "step_started", step: str | None = "auto", **data: Any) -> Event:
    return Event(run, kind, T0 + i / 7, f"s{i}" if step == "auto" else step, {"i": i, **data})


def key(e: Event) -> tuple[Any, ...]:
    """Everything but pos, with data as a plain dict (implementations may return another Mapping)."""
    return (e.run_id, e.kind, e.at, e.step, dict(e.data))


def assert_increasing(positions: list[int | None]) -> None:
    assert all(isinstance(p, int) and p > 0 for p in positions), positions
    assert all(a < b for a, b in itertools.pairwise(positions)), positions  # type: ignore[operator]


# -- events -------------------------------------------------------------------------------------------------------
async def test_append_flush_read_round_trip(backend: Backend) -> None:
    written = [
        ev("r1", 0, "run_created", None, plan={"steps": ["a", "b"]}, nested={"x": [1, 2.5, None, True]}),
        ev("r1", 1, "step_started", "a", attempt=1),
        ev("r2", 2, "run_created", None),
        ev("r1", 3, "step_succeeded", "a", attempt=1, output="ref"),
        ev("r2", 4, "step_failed", "b", error="boom: ünïcödé ✓", final=False, retry_in=0.25),
        ev("r1", 5, "run_finished", None, status="succeeded", error=None),
    ]
    async with open_journal(backend.url) as journal:
        for e in written:
            journal.append(e)
        await journal.flush()
        if backend.durable:
            assert backend.count("events") == len(written)  # on disk, seen by another connection
        stored = await journal.read()
    assert [key(e) for e in stored] == [key(e) for e in written]
    assert_increasing([e.pos for e in stored])


async def test_read_filters_by_run(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        for i in range(30):
            journal.append(ev(f"run-{i % 3}", i))
        await journal.flush()
        for r in range(3):
            events = await journal.read(f"run-{r}")
            assert [e.data["i"] for e in events] == list(range(r, 30, 3))
            assert {e.run_id for e in events} == {f"run-{r}"}
            assert_increasing([e.pos for e in events])
        assert await journal.read("no-such-run") == []


async def test_read_after_resumes_exactly_after_pos(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        for i in range(12):
            journal.append(ev("a" if i % 2 else "b", i))
        await journal.flush()
        everything = await journal.read()
        for n, e in enumerate(everything):
            assert e.pos is not None
            assert [key(x) for x in await journal.read(after=e.pos)] == [key(x) for x in everything[n + 1 :]]
            tail = [key(x) for x in everything[n + 1 :] if x.run_id == "a"]
            assert [key(x) for x in await journal.read("a", after=e.pos)] == tail
        assert await journal.read(after=0) == everything
        last = everything[-1].pos
        assert last is not None
        assert await journal.read(after=last) == []
        # A reader that saw everything picks up exactly the new event, with a larger pos.
        journal.append(ev("a", 99))
        await journal.flush()
        (new,) = await journal.read(after=last)
        assert key(new) == key(ev("a", 99))
        assert new.pos is not None and new.pos > last


async def test_read_includes_events_appended_before_it_without_a_flush(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        journal.append(ev("r", 1))
        journal.append(ev("r", 2))
        assert [e.data["i"] for e in await journal.read("r")] == [1, 2]
        ref = journal.put_blob({"fresh": True})
        assert await journal.get_blobs([ref]) == {ref: {"fresh": True}}
        journal.append(ev("s", 3))
        assert await journal.run_ids() == ["r", "s"]


async def test_run_ids_are_distinct_and_oldest_first(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        assert await journal.run_ids() == []
        # Not alphabetical, and runs recur: only the first appearance counts.
        for i, run in enumerate(["zeta", "alpha", "zeta", "mid", "alpha", "zeta", "beta"]):
            journal.append(ev(run, i))
        await journal.flush()
        assert await journal.run_ids() == ["zeta", "alpha", "mid", "beta"]


async def test_event_data_with_a_nul_character_is_stored(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        journal.append(ev("r", 1, "step_failed", error="bad\x00byte \\u0000 literal"))
        await journal.flush()
        (stored,) = await journal.read("r")
    # PostgreSQL's JSONB cannot hold U+0000: it is replaced there; the literal backslash text is never touched.
    assert stored.data["error"] in ("bad\x00byte \\u0000 literal", "bad\ufffdbyte \\u0000 literal")


# -- blobs --------------------------------------------------------------------------------------------------------
async def test_put_blob_returns_one_ref_per_value_and_stores_it_once(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        ref = journal.put_blob({"a": 1, "b": [1, 2]})
        assert ref == journal.put_blob({"b": [1, 2], "a": 1})  # equal values, other key order: same content
        assert ref == hashlib.sha256(b'{"a":1,"b":[1,2]}').hexdigest()
        other = journal.put_blob({"a": 1, "b": [2, 1]})
        assert other != ref
        await journal.flush()
        assert journal.put_blob({"a": 1, "b": [1, 2]}) == ref  # again, after it was stored
        await journal.flush()
        if backend.durable:
            assert backend.count("blobs") == 2
        assert await journal.get_blobs([ref, other]) == {ref: {"a": 1, "b": [1, 2]}, other: {"a": 1, "b": [2, 1]}}


async def test_get_blobs_round_trip_and_leaves_missing_refs_out(backend: Backend) -> None:
    values: list[Any] = [
        {"text": "héllo ✓", "nested": {"list": [1, 2.5, None, True, {"deep": ["x"]}]}, "empty": {}},
        [1, "two", [3, [4, [5]]]],
        "just a string",
        42,
        None,
    ]
    async with open_journal(backend.url) as journal:
        refs = [journal.put_blob(v) for v in values]
        await journal.flush()
        missing = "0" * 64
        got = await journal.get_blobs([*refs, missing, refs[0]])
        assert got == dict(zip(refs, values, strict=True))
        assert missing not in got
        assert await journal.get_blobs([]) == {}
        assert await journal.get_blobs([missing]) == {}


async def test_unserialisable_output_raises_synchronously(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        with pytest.raises(OutputNotSerialisable):
            journal.put_blob(object())
        with pytest.raises(OutputNotSerialisable):
            journal.put_blob({"fine": 1, "bad": {1, 2}})
        assert issubclass(OutputNotSerialisable, TypeError)
        await journal.flush()  # nothing half-buffered breaks the journal
        if backend.durable:
            assert backend.count("blobs") == 0
        ref = journal.put_blob({"ok": True})
        assert await journal.get_blobs([ref]) == {ref: {"ok": True}}


# -- durability and concurrency -------------------------------------------------------------------------------
async def test_flushed_events_survive_in_a_new_journal_object(durable: Backend) -> None:
    async with open_journal(durable.url) as first:
        assert first.durable
        for i in range(50):
            first.append(ev(f"r{i % 2}", i, data={"payload": "x" * i}))
        ref = first.put_blob({"output": [1, 2, 3]})
        await first.flush()
        before = await first.read()
    async with open_journal(durable.url) as second:
        after = await second.read()
        assert [(e.pos, *key(e)) for e in after] == [(e.pos, *key(e)) for e in before]
        assert await second.get_blobs([ref]) == {ref: {"output": [1, 2, 3]}}
        assert await second.run_ids() == ["r0", "r1"]
        second.append(ev("r2", 50))
        await second.flush()
        (new,) = await second.read("r2")
        last = before[-1].pos
        assert new.pos is not None and last is not None and new.pos > last


async def test_close_stores_what_was_buffered(durable: Backend) -> None:
    async with open_journal(durable.url) as first:
        for i in range(10):
            first.append(ev("r", i))
        ref = first.put_blob("kept")
        # no flush: close must do it
    async with open_journal(durable.url) as second:
        assert [e.data["i"] for e in await second.read("r")] == list(range(10))
        assert await second.get_blobs([ref]) == {ref: "kept"}


async def test_many_tasks_appending_concurrently_are_stored_in_append_order(backend: Backend) -> None:
    appended: list[tuple[str, int]] = []

    async def producer(journal: Any, t: int) -> None:
        for i in range(100):
            journal.append(ev(f"task-{t}", i, step=f"t{t}-{i}"))
            appended.append((f"task-{t}", i))
            if (i + t) % 3 == 0:
                await asyncio.sleep(0)  # let the other tasks and the writer interleave

    async with open_journal(backend.url) as journal:
        async with asyncio.TaskGroup() as tg:
            for t in range(50):
                tg.create_task(producer(journal, t))
        await journal.flush()
        stored = await journal.read()
        if backend.durable:
            assert backend.count("events") == 5000
    assert len(appended) == 5000
    assert [(e.run_id, e.data["i"]) for e in stored] == appended
    assert_increasing([e.pos for e in stored])


async def test_flush_with_nothing_buffered_returns_promptly(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        async with asyncio.timeout(2):
            await journal.flush()
            journal.append(ev("r", 1))
            await journal.flush()
            commits = getattr(journal, "commits", None)
            for _ in range(100):
                await journal.flush()
        assert getattr(journal, "commits", None) == commits  # an empty flush writes no transaction


async def test_a_cancelled_flush_does_not_break_the_journal(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        journal.append(ev("r", 1))
        waiter = asyncio.create_task(journal.flush())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        journal.append(ev("r", 2))
        async with asyncio.timeout(10):
            await journal.flush()
        assert [e.data["i"] for e in await journal.read("r")] == [1, 2]


async def test_close_twice_is_harmless(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        journal.append(ev("r", 1))
        await journal.close()
        await journal.close()
    # the context manager closed it a third time
    if backend.durable:
        assert backend.count("events") == 1
        with pytest.raises(JournalError, match="closed"):
            journal.append(ev("r", 2))  # a durable journal must not drop an event silently


async def test_group_commit_writes_batches_not_one_transaction_per_event(durable: Backend) -> None:
    async with open_journal(durable.url) as journal:
        assert isinstance(journal, GroupCommitJournal)
        start = journal.commits
        for i in range(10_000):
            journal.append(ev("burst", i))
        await journal.flush()
        assert journal.commits == start + 1  # appended without yielding: exactly one transaction
        start = journal.commits
        for i in range(10_000):
            journal.append(ev("trickle", i))
            await asyncio.sleep(0)  # the writer could run after every single event
        await journal.flush()
        # A commit (an fsync) takes far longer than a loop iteration, so events pile up while one is written.
        assert journal.commits - start < 1000, journal.commits - start
        assert durable.count("events") == 20_000
        assert [e.data["i"] for e in await journal.read("trickle")] == list(range(10_000))


async def test_several_processes_share_one_journal(durable: Backend) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from planweave.core.events import Event
        from planweave.journal import open_journal

        async def main(url, run):
            async with open_journal(url) as journal:
                for i in range(2000):
                    journal.append(Event(run, "step_started", float(i), f"s{i}", {"i": i}))
                    if i % 7 == 0:
                        await asyncio.sleep(0)
                        await asyncio.sleep(0.0005)

        asyncio.run(main(sys.argv[1], sys.argv[2]))
        """
    )
    async with open_journal(durable.url) as journal:  # creates the tables before the children race
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", script, durable.url, f"child-{n}", stderr=asyncio.subprocess.PIPE
            )
            for n in range(2)
        ]
        for i in range(2000):  # and write concurrently from this process too
            journal.append(ev("parent", i))
            if i % 7 == 0:
                await asyncio.sleep(0.0005)
        await journal.flush()
        for child in children:
            async with asyncio.timeout(60):
                _, err = await child.communicate()
            assert child.returncode == 0, err.decode()
        stored = await journal.read()
        assert_increasing([e.pos for e in stored])
        for run in ("parent", "child-0", "child-1"):
            assert [e.data["i"] for e in stored if e.run_id == run] == list(range(2000))
        assert sorted(await journal.run_ids()) == ["child-0", "child-1", "parent"]


# -- failures -----------------------------------------------------------------------------------------------------
async def test_a_failed_write_makes_flush_raise_instead_of_hanging(durable: Backend) -> None:
    assert durable.execute is not None
    async with open_journal(durable.url) as journal:
        journal.append(ev("r", 1))
        await journal.flush()
        durable.execute(f"DROP TABLE {durable.table('events')}")  # what a full disk would do, reproducibly
        journal.append(ev("r", 2))
        async with asyncio.timeout(20):
            with pytest.raises(JournalError, match="could not write to the journal"):
                await journal.flush()
            # The loss is permanent: later flushes (and close) keep saying so rather than write around a gap.
            journal.append(ev("r", 3))
            with pytest.raises(JournalError, match="could not write"):
                await journal.flush()
            with pytest.raises(JournalError, match="could not write"):
                await journal.close()
            await journal.close()


async def test_unserialisable_event_data_is_refused_at_append(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        refused = r"event 'step_failed' of run 'r'.* at error is a object: not JSON-serialisable"
        with pytest.raises(EventNotRecorded, match=refused):
            journal.append(ev("r", 1, "step_failed", error=object()))
        journal.append(ev("r", 2))
        async with asyncio.timeout(20):
            await journal.flush()
            assert [e.data["i"] for e in await journal.read("r")] == [2]


async def test_a_journal_written_by_a_newer_planweave_is_refused(durable: Backend) -> None:
    async with open_journal(durable.url):
        pass
    meta = "meta" if durable.name == "sqlite" else durable.table("events").replace("planweave_events", "planweave_meta")
    assert durable.execute is not None
    durable.execute(f"UPDATE {meta} SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(JournalError, match="schema version 999"):
        async with open_journal(durable.url):
            pass


# -- SQLite specifics ---------------------------------------------------------------------------------------------
async def test_sqlite_creates_missing_parent_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = tmp_path / "a" / "b" / "c" / "runs.db"
    async with open_journal(f"sqlite:///{absolute}") as journal:  # sqlite:////tmp/...: four slashes, absolute
        journal.append(ev("r", 1))
    assert absolute.is_file()
    monkeypatch.chdir(tmp_path)
    async with open_journal("sqlite:///rel/dir/runs.db") as journal:  # three slashes: relative to the cwd
        journal.append(ev("r", 1))
    assert (tmp_path / "rel" / "dir" / "runs.db").is_file()
    async with open_journal(f"sqlite:///{absolute}") as journal:
        assert [key(e) for e in await journal.read()] == [key(ev("r", 1))]


def test_sqlite_url_paths() -> None:
    assert path_of("sqlite:///runs.db") == "runs.db"
    assert path_of("sqlite:///.planweave/runs.db") == ".planweave/runs.db"
    assert path_of("sqlite:////var/lib/runs.db") == "/var/lib/runs.db"
    assert path_of("sqlite:///:memory:") == ":memory:"
    for bad in ("sqlite://", "sqlite:///", "sqlite://host/runs.db"):
        with pytest.raises(JournalError):
            path_of(bad)


async def test_sqlite_in_memory_database_works_while_open() -> None:
    async with open_journal("sqlite:///:memory:") as journal:
        journal.append(ev("r", 1))
        ref = journal.put_blob([1])
        assert [key(e) for e in await journal.read()] == [key(ev("r", 1))]
        assert await journal.get_blobs([ref]) == {ref: [1]}


async def test_sqlite_uses_wal_and_full_sync(tmp_path: Path) -> None:
    async with open_journal(f"sqlite:///{tmp_path / 'runs.db'}") as journal:
        assert isinstance(journal, SQLiteJournal)
        mode = await journal._call(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
        sync = await journal._call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
        busy = await journal._call(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0])
    assert (mode, sync) == ("wal", 2)  # 2 = FULL
    assert busy >= 1000


async def test_sqlite_disk_full_is_reported(tmp_path: Path) -> None:
    async with open_journal(f"sqlite:///{tmp_path / 'runs.db'}") as journal:
        assert isinstance(journal, SQLiteJournal)
        # Cap the file at its current size: the next write that needs a new page fails with SQLITE_FULL.
        await journal._call(lambda c: c.execute("PRAGMA max_page_count = 1").fetchall())
        journal.put_blob("x" * 1_000_000)
        journal.append(ev("r", 1))
        async with asyncio.timeout(20):
            with pytest.raises(JournalError, match=r"could not write to the journal sqlite:.*full"):
                await journal.flush()
            with pytest.raises(JournalError, match="full"):
                await journal.close()


async def test_sqlite_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(JournalError, match="could not open the journal"):
        async with open_journal(f"sqlite:///{path}"):
            pass


# -- PostgreSQL specifics -----------------------------------------------------------------------------------------
def test_postgres_url_parsing_strips_schema_and_hides_passwords() -> None:
    conninfo, schema, safe = parse_url("postgresql://bob:s3cret@db.example:5432/runs?schema=tenant_1&sslmode=require")
    assert schema == "tenant_1"
    assert conninfo == "postgresql://bob:s3cret@db.example:5432/runs?sslmode=require"
    assert "s3cret" not in safe and "bob:***@db.example" in safe
    assert parse_url("postgresql://127.0.0.1/test")[1] is None
    assert "hunter2" not in redact("postgresql://h/db?password=hunter2&user=x")


async def test_postgres_connection_failure_names_the_url_without_password() -> None:
    with pytest.raises(JournalError) as info:
        async with open_journal("postgresql://bob:s3cret@127.0.0.1:1/nowhere?connect_timeout=3"):
            pass
    message = str(info.value)
    assert "could not connect to the journal postgresql://bob:***@127.0.0.1:1/nowhere" in message
    assert "s3cret" not in message


@pytest.mark.postgres
async def test_postgres_schemas_keep_journals_apart(pg_backend: Backend) -> None:
    async with open_journal(pg_backend.url) as journal:
        journal.append(ev("mine", 1))
    other = pg_backend.url.replace("schema=", "schema=other_")
    try:
        async with open_journal(other) as journal:
            assert await journal.run_ids() == []
    finally:
        assert pg_backend.execute is not None
        schema = other.rpartition("schema=")[2]
        pg_backend.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    async with open_journal(pg_backend.url) as journal:
        assert await journal.run_ids() == ["mine"]



async def test_read_can_filter_by_kind(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        kinds: list[EventKind] = ["step_started", "run_cancel_requested", "step_started", "run_cancel_requested"]
        for i, kind in enumerate(kinds):
            journal.append(ev("r", i, kind, "s" if kind == "step_started" else None))
        journal.append(ev("other", 9, "run_cancel_requested", None))
        await journal.flush()
        got = await journal.read("r", kind="run_cancel_requested")
        assert [e.data["i"] for e in got] == [1, 3]
        later = await journal.read("r", after=got[0].pos or 0, kind="run_cancel_requested")
        assert [e.data["i"] for e in later] == [3]
        assert len(await journal.read(None, kind="run_cancel_requested")) == 3


# -- events and outputs that cannot be stored (one bad event must not poison the journal) --------------------------
async def test_an_event_that_cannot_be_encoded_is_refused_and_the_journal_keeps_working(backend: Backend) -> None:
    bad = ev("bad", 1, "run_created", None, plan={"steps": [{"id": "a", "tool": "noop", "args": {"x": "\ud800"}}]})
    async with open_journal(backend.url) as journal:
        journal.append(ev("good", 0))
        with pytest.raises(EventNotRecorded) as info:
            journal.append(bad)
        assert isinstance(info.value, JournalError)
        message = str(info.value)
        assert "event 'run_created' of run 'bad'" in message
        assert "plan.steps[0].args.x" in message and "surrogate" in message
        journal.append(ev("good", 2))
        async with asyncio.timeout(20):
            await journal.flush()
            journal.append(ev("good", 3))
            await journal.flush()
            assert [e.data["i"] for e in await journal.read("good")] == [0, 2, 3]
            assert await journal.read("bad") == []
            assert await journal.run_ids() == ["good"]
            ref = journal.put_blob({"still": "working"})
            assert await journal.get_blobs([ref]) == {ref: {"still": "working"}}
    if backend.durable:
        assert backend.count("events") == 3
    async with open_journal(backend.url) as again:  # closing stored everything; a new object reads it
        if backend.durable:
            assert [e.data["i"] for e in await again.read("good")] == [0, 2, 3]


@pytest.mark.parametrize("where", ["key", "nested"])
async def test_refused_events_are_never_in_a_batch(backend: Backend, where: str) -> None:
    data: dict[str, Any] = {"\udfff": 1} if where == "key" else {"deep": [1, {"x": ["ok", "\ud83d"]}]}
    async with open_journal(backend.url) as journal:
        for i in range(5):
            journal.append(ev("r", i))
            with pytest.raises(EventNotRecorded):
                journal.append(ev("r", 100 + i, **data))
        async with asyncio.timeout(20):
            await journal.close()
    async with open_journal(backend.url) as journal:
        if backend.durable:
            assert [e.data["i"] for e in await journal.read("r")] == [0, 1, 2, 3, 4]


async def test_integers_of_any_size_round_trip_exactly(backend: Backend) -> None:
    big: dict[str, Any] = {"n": 2**70, "neg": -(2**80), "edge": 2**64, "small": 2**63 - 1, "f": 0.1,
                           "s": "12345678901234567890123", "nested": [[3**50, {"k": 10**30}]]}
    async with open_journal(backend.url) as journal:
        ref = journal.put_blob(big)
        assert ref == journal.put_blob(dict(reversed(big.items())))  # canonical: key order does not matter
        journal.append(ev("r", 1, **big))
        async with asyncio.timeout(20):
            assert await journal.get_blobs([ref]) == {ref: big}
            (stored,) = await journal.read("r")
    assert stored.data == {"i": 1, **big}
    assert isinstance(stored.data["n"], int)


async def test_outputs_are_stored_in_canonical_form(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        ref = journal.put_blob({1: "one", "t": (3, 4), None: 0, 2.5: [(), {False: 1}]})
        async with asyncio.timeout(20):
            expected = {"1": "one", "t": [3, 4], "null": 0, "2.5": [[], {"false": 1}]}
            assert await journal.get_blobs([ref]) == {ref: expected}


@pytest.mark.parametrize(("value", "where"), [
    ([1, 2, {"x": float("nan")}], r"at \[2\]\.x is NaN"),
    ({"a b": float("inf")}, r"at \[\"a b\"\] is Infinity"),
    (float("-inf"), r"output is -Infinity"),
    ({"t": (1, "\ud800")}, r"at t\[1\] holds a lone surrogate"),
    ({"n": 2**70, "bad": float("nan")}, r"at bad is NaN"),
])
async def test_outputs_that_json_cannot_hold_exactly_are_refused(backend: Backend, value: Any, where: str) -> None:
    async with open_journal(backend.url) as journal:
        with pytest.raises(OutputNotSerialisable, match=where):
            journal.put_blob(value)
        async with asyncio.timeout(20):
            await journal.flush()
    if backend.durable:
        assert backend.count("blobs") == 0


async def test_an_event_whose_run_or_step_id_cannot_be_encoded_is_refused(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        with pytest.raises(EventNotRecorded, match=r"run id 'r\\udc00' holds a lone surrogate"):
            journal.append(ev("r\udc00", 1))
        with pytest.raises(EventNotRecorded, match="step id"):
            journal.append(ev("r", 2, step="s\ud800"))
        journal.append(ev("r", 3))
        async with asyncio.timeout(20):
            assert [e.data["i"] for e in await journal.read()] == [3]


async def test_outputs_orjson_refuses_but_json_can_hold_are_stored_exactly(backend: Backend) -> None:
    deep: Any = "leaf"
    for _ in range(300):  # deeper than orjson's limit of 255 levels
        deep = [deep]
    values = [{2**64: "a big key", "v": (1, 2)}, deep]
    async with open_journal(backend.url) as journal:
        refs = [journal.put_blob(v) for v in values]
        async with asyncio.timeout(20):
            got = await journal.get_blobs(refs)
    assert got[refs[0]] == {"18446744073709551616": "a big key", "v": [1, 2]}
    assert got[refs[1]] == deep


async def test_an_encoded_output_is_stored_as_it_is(backend: Backend) -> None:
    value = {"t": (1, 2), 3: 2**70}
    blob = canonical_output(value, step="s")
    async with open_journal(backend.url) as journal:
        assert journal.put_blob(blob) == blob.ref == journal.put_blob(value)
        async with asyncio.timeout(20):
            assert await journal.get_blobs([blob.ref]) == {blob.ref: blob.value}
    assert blob.value == {"t": [1, 2], "3": 2**70}


# -- run summaries and pruning ------------------------------------------------------------------------------------
def _summary_tools() -> Toolbox:
    box = builtin_tools()

    async def boom() -> None:
        """Fail every time."""
        raise ValueError("boom")

    box.add(boom)
    return box


def _runs_table(backend: Backend) -> str:
    return "runs" if backend.name == "sqlite" else f"{backend.table('events').partition('.')[0]}.planweave_runs"


async def _three_runs(journal: Journal) -> None:
    """Runs 'ok' (succeeded), 'bad' (failed, one step succeeding with ok's output) and 'gated' (waiting for a
    person when the engine closes: left running)."""
    asked = asyncio.Event()

    def on_event(event: Event) -> None:
        if event.kind == "approval_requested":
            asked.set()

    async with Engine(journal, tools=_summary_tools()) as engine:
        ok = await engine.start({"name": "fine", "steps": [{"id": "a", "tool": "noop", "args": {"v": 1}},
                                                           {"id": "b", "tool": "noop", "after": ["a"]}]}, run_id="ok")
        await ok.wait()
        bad = await engine.start({"steps": [{"id": "a", "tool": "noop", "args": {"v": 1}},
                                            {"id": "x", "tool": "boom"}]}, run_id="bad", on_failure="continue")
        await bad.wait()
        await engine.start({"steps": [{"id": "g", "tool": "noop", "approval": "Go?"}]}, run_id="gated",
                           on_event=on_event)
        async with asyncio.timeout(20):
            await asyncio.wait_for(asked.wait(), 20)


async def test_run_summaries_list_newest_first_and_equal_the_fold_of_the_events(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        await _three_runs(journal)
        if backend.execute is not None:  # written as the runs went, from the engine's states: nothing to fold
            await journal.flush()
            assert backend.execute(f"SELECT run_id FROM {_runs_table(backend)} WHERE stale = 1") == []
        async with asyncio.timeout(20):
            page = await journal.list_runs()
            folded = {s.run_id: fold_summary(s.run_id, await journal.read(s.run_id), s.seq) for s in page.runs}
            last_pos = (await journal.read())[-1].pos
    assert page.position == last_pos  # the list is current to the journal's last event
    assert [s.run_id for s in page.runs] == ["gated", "bad", "ok"] and page.next is None
    ok, bad, gated = page.runs[2], page.runs[1], page.runs[0]
    assert (ok.status, ok.plan, dict(ok.steps)) == ("succeeded", "fine", {"succeeded": 2})
    assert (bad.status, dict(bad.steps)) == ("failed", {"succeeded": 1, "failed": 1})
    assert "boom" in (bad.error or "")
    assert (gated.status, dict(gated.steps), dict(gated.waiting)) == (
        "running", {"waiting_approval": 1}, {"g": "waiting_approval"})
    assert ok.owner["pid"] == os.getpid() and ok.source == "plan"
    assert ok.started_at is not None and ok.finished_at is not None and ok.started_at <= ok.finished_at
    assert ok.seq < bad.seq < gated.seq
    # What the journal kept as the runs changed is exactly what folding their stored events gives.
    assert {s.run_id: s for s in page.runs} == folded
    if backend.durable:
        async with open_journal(backend.url) as journal, asyncio.timeout(20):
            assert (await journal.list_runs()).runs == page.runs


async def test_run_listings_filter_by_status_and_start_and_page_with_a_cursor(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        async with Engine(journal, tools=_summary_tools()) as engine:
            for i in range(7):
                tool = "boom" if i % 2 else "noop"
                run = await engine.start({"steps": [{"id": "s", "tool": tool}]}, run_id=f"r{i}")
                await run.wait()
        async with asyncio.timeout(20):
            every = (await journal.list_runs()).runs
            pages: list[list[str]] = []
            cursor: int | None = None
            while True:
                page = await journal.list_runs(RunQuery(limit=3, before=cursor))
                pages.append([s.run_id for s in page.runs])
                if page.next is None:
                    break
                cursor = page.next
            failed = await journal.list_runs(RunQuery(statuses=frozenset({"failed"}), limit=2))
            failed_rest = await journal.list_runs(RunQuery(statuses=frozenset({"failed"}), limit=2,
                                                           before=failed.next))
            since = await journal.list_runs(RunQuery(since=every[2].started_at))
    assert [s.run_id for s in every] == [f"r{i}" for i in range(6, -1, -1)]
    assert pages == [["r6", "r5", "r4"], ["r3", "r2", "r1"], ["r0"]]
    assert [s.run_id for s in failed.runs] == ["r5", "r3"] and failed.next is not None
    assert [s.run_id for s in failed_rest.runs] == ["r1"] and failed_rest.next is None
    assert [s.run_id for s in since.runs] == ["r6", "r5", "r4"]
    with pytest.raises(ValueError, match="at least 1"):
        RunQuery(limit=0)


async def test_events_written_outside_the_engine_are_folded_into_the_summary(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        await _three_runs(journal)  # 'gated' is left running: as after a crash, another process may end it
        now = time.time()
        journal.append(Event("gated", "run_cancelled", now, None, {"reason": "by hand"}))
        journal.append(Event("gated", "run_finished", now, None, {"status": "cancelled", "error": "by hand"}))
        async with asyncio.timeout(20):
            gated = (await journal.list_runs(RunQuery(limit=1))).runs[0]
            again = (await journal.list_runs(RunQuery(limit=1))).runs[0]
            cancelled = await journal.list_runs(RunQuery(statuses=frozenset({"cancelled"})))
    assert (gated.run_id, gated.status, gated.error, gated.finished_at) == ("gated", "cancelled", "by hand", now)
    assert again == gated and [s.run_id for s in cancelled.runs] == ["gated"]


async def test_a_journal_from_before_summaries_is_backfilled_once(backend: Backend) -> None:
    if not backend.durable:
        pytest.skip("only a stored journal has a schema to migrate")
    async with open_journal(backend.url) as journal:
        await _three_runs(journal)
        async with asyncio.timeout(20):
            before = (await journal.list_runs()).runs
    assert backend.execute is not None
    if backend.name == "sqlite":  # back to version 1: no summary table
        backend.execute("DROP TABLE runs")
        backend.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    else:
        schema = backend.table("events").partition(".")[0]
        backend.execute(f"DROP TABLE {schema}.planweave_runs")
        backend.execute(f"UPDATE {schema}.planweave_meta SET value = '1' WHERE key = 'schema_version'")
    async with open_journal(backend.url) as journal, asyncio.timeout(20):
        assert (await journal.list_runs()).runs == before
    # Folded once, then stored.
    assert backend.execute(f"SELECT count(*) FROM {_runs_table(backend)} WHERE stale = 1") == [(0,)]


async def test_prune_removes_ended_runs_and_the_outputs_only_they_used(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        await _three_runs(journal)
        async with asyncio.timeout(20):
            (bad_a,) = [e.data["output"] for e in await journal.read("bad", kind="step_succeeded")]
            assert await journal.prune(0.0) == PruneResult([], 0, 0, 0, None)  # nothing ended before 1970
            first = await journal.prune(time.time() + 60)  # default: succeeded and cancelled
            assert await journal.read("ok") == []
            assert [s.run_id for s in (await journal.list_runs()).runs] == ["gated", "bad"]
            assert bad_a in await journal.get_blobs([bad_a])  # ok's output is bad's too: kept
            second = await journal.prune(time.time() + 60, {"failed"})
            left = (await journal.list_runs()).runs
            assert await journal.get_blobs([bad_a]) == {}
            with pytest.raises(ValueError, match="cannot prune runs that are running"):
                await journal.prune(time.time() + 60, {"running", "failed"})
    assert first.runs == ["ok"] and first.events >= 6 and first.outputs == 1 and first.bytes_freed > 0
    assert second.runs == ["bad"] and second.outputs == 1 and second.bytes_freed > 0
    assert [s.run_id for s in left] == ["gated"]  # a running run is never pruned
    if backend.name == "sqlite":
        assert first.file_bytes_freed is not None


async def test_a_long_running_run_lists_as_its_events_fold_while_it_runs_and_when_it_ends(backend: Backend) -> None:
    # 300 steps: above the size summarised in every batch, so its summary is refreshed at most every 0.25 s.
    reached, gate = asyncio.Event(), asyncio.Event()
    tools = _summary_tools()

    async def hold(at: int) -> int:
        """Stop at the gate."""
        reached.set()
        await gate.wait()
        return at

    tools.add(hold)
    steps: list[dict[str, Any]] = [{"id": f"s{i}", "tool": "noop", **({"after": [f"s{i - 1}"]} if i else {})}
                                   for i in range(300)]
    steps[150] = {"id": "s150", "tool": "hold", "args": {"at": 150}, "after": ["s149"]}
    async with open_journal(backend.url) as journal, Engine(journal, tools=tools) as engine:
        run = await engine.start({"steps": steps}, run_id="long")
        async with asyncio.timeout(20):
            await reached.wait()
            (during,) = (await journal.list_runs()).runs
            folded = fold_summary("long", await journal.read("long"), during.seq)
            gate.set()
            await run.wait()
            (after,) = (await journal.list_runs()).runs
            folded_after = fold_summary("long", await journal.read("long"), after.seq)
    assert during == folded and dict(during.steps) == {"succeeded": 150, "running": 1, "pending": 149}
    assert after == folded_after and dict(after.steps) == {"succeeded": 300} and after.status == "succeeded"


# -- the result cache's index (docs/caching.md) -------------------------------------------------------------------
def _succeeded(run: str, step: str, at: float, output: str, **data: Any) -> Event:
    return Event(run, "step_succeeded", at, step, {"attempt": 1, "output": output, **data})


async def test_find_cached_answers_the_newest_output_under_a_key_no_older_than_asked(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        assert await journal.find_cached("k", -math.inf) is None
        old, new = journal.put_blob({"v": 1}), journal.put_blob({"v": 2})
        journal.append(_succeeded("r1", "a", T0, old, cache_key="k"))
        journal.append(_succeeded("r2", "b", T0 + 5, new, cache_key="k"))
        journal.append(_succeeded("r2", "c", T0 + 6, new, cache_key="other"))
        journal.append(_succeeded("r3", "d", T0 + 9, old, cache_key="k",  # a reuse: not indexed again
                                  cache={"run": "r1", "step": "a", "at": T0}))
        journal.append(_succeeded("r3", "e", T0 + 9, old))  # no key: not cacheable
        await journal.flush()
        async with asyncio.timeout(20):
            newest = await journal.find_cached("k", -math.inf)
            at_edge = await journal.find_cached("k", T0 + 5)
            too_old = await journal.find_cached("k", T0 + 5.001)
            older = await journal.find_cached("k", T0 - 1)
            other = await journal.find_cached("other", T0)
            unknown = await journal.find_cached("nope", -math.inf)
    # With its value; at exactly T0 + 5: still usable.
    assert newest == at_edge == older == CachedOutput("r2", "b", T0 + 5, new, {"v": 2})
    assert too_old is None and unknown is None
    assert other == CachedOutput("r2", "c", T0 + 6, new, {"v": 2})
    if backend.durable:  # the index is stored: a new journal object (another process) answers the same
        async with open_journal(backend.url) as journal, asyncio.timeout(20):
            assert await journal.find_cached("k", -math.inf) == newest


async def test_the_cache_index_is_written_with_its_events_and_never_for_refused_ones(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        ref = journal.put_blob("x")
        journal.append(_succeeded("r", "a", T0, ref, cache_key="k"))
        with pytest.raises(EventNotRecorded):
            journal.append(_succeeded("r", "b", T0, ref, cache_key="k2", bad=object()))
        await journal.flush()
        async with asyncio.timeout(20):
            found = await journal.find_cached("k", -math.inf)
            refused = await journal.find_cached("k2", -math.inf)
    assert found == CachedOutput("r", "a", T0, ref, "x") and refused is None
    if backend.execute is not None:
        assert backend.count("cache") == 1


async def test_prune_leaves_no_cache_entry_naming_a_removed_run_or_output(backend: Backend) -> None:
    box = builtin_tools()

    async def square(x: int) -> int:
        """x squared."""
        return x * x

    box.add(square, idempotent=True, cache=True)
    async with open_journal(backend.url) as journal:
        async with Engine(journal, tools=box) as engine:
            for run_id, x in (("old", 2), ("other", 3)):
                assert (await (await engine.start({"steps": [{"id": "s", "tool": "square", "args": {"x": x}}]},
                                                  run_id=run_id)).wait()).ok
        async with asyncio.timeout(20):
            (old_end,) = [e.at for e in await journal.read("old", kind="run_finished")]
            (other_out,) = [e.data["output"] for e in await journal.read("other", kind="step_succeeded")]
            (key_old,) = [e.data["cache_key"] for e in await journal.read("old", kind="step_succeeded")]
            (key_other,) = [e.data["cache_key"] for e in await journal.read("other", kind="step_succeeded")]
            assert (await journal.find_cached(key_old, -math.inf) or CachedOutput("", "", 0, "")).run_id == "old"
            pruned = await journal.prune(math.nextafter(old_end, math.inf))
            gone = await journal.find_cached(key_old, -math.inf)
            kept = await journal.find_cached(key_other, -math.inf)
            blobs = await journal.get_blobs([other_out])
    assert pruned.runs == ["old"] and gone is None
    assert kept is not None and kept.run_id == "other" and blobs == {other_out: 9}
    if backend.execute is not None:  # no stored entry outlives its run or its output
        cache, events, blobs_table = backend.table("cache"), backend.table("events"), backend.table("blobs")
        assert backend.execute(f"SELECT count(*) FROM {cache} c WHERE NOT EXISTS "
                               f"(SELECT 1 FROM {events} e WHERE e.run_id = c.run_id)") == [(0,)]
        assert backend.execute(f"SELECT count(*) FROM {cache} c WHERE NOT EXISTS "
                               f"(SELECT 1 FROM {blobs_table} b WHERE b.ref = c.output)") == [(0,)]


async def test_a_journal_from_before_the_cache_index_is_indexed_from_its_events(backend: Backend) -> None:
    if not backend.durable:
        pytest.skip("only a stored journal has a schema to migrate")
    async with open_journal(backend.url) as journal:
        ref = journal.put_blob([1])
        journal.append(_succeeded("r", "a", T0, ref, cache_key="k"))
        journal.append(_succeeded("r", "b", T0 + 1, ref, cache_key="k", cache={"run": "r", "step": "a", "at": T0}))
    assert backend.execute is not None
    if backend.name == "sqlite":  # back to version 2: no cache table
        backend.execute("DROP TABLE cache")
        backend.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    else:
        schema = backend.table("events").partition(".")[0]
        backend.execute(f"DROP TABLE {schema}.planweave_cache")
        backend.execute(f"UPDATE {schema}.planweave_meta SET value = '2' WHERE key = 'schema_version'")
    async with open_journal(backend.url) as journal, asyncio.timeout(20):
        assert await journal.find_cached("k", -math.inf) == CachedOutput("r", "a", T0, ref, [1])
    assert backend.count("cache") == 1  # the reuse was not indexed
    meta = "meta" if backend.name == "sqlite" else f"{backend.table('events').partition('.')[0]}.planweave_meta"
    backend.execute(f"UPDATE {meta} SET value = '2' WHERE key = 'schema_version'")  # migrated again: no duplicate
    async with open_journal(backend.url):
        pass
    assert backend.count("cache") == 1


async def test_a_batch_whose_cache_index_cannot_be_written_stores_none_of_its_events(durable: Backend) -> None:
    # One transaction: an index row that fails takes its event (and the whole batch) with it, never half of it.
    assert durable.execute is not None
    async with open_journal(durable.url) as journal:
        ref = journal.put_blob("kept")
        journal.append(_succeeded("before", "a", T0, ref))
        await journal.flush()
        cache = durable.table("cache")
        if durable.name == "sqlite":
            durable.execute(f"CREATE TRIGGER refuse_index BEFORE INSERT ON {cache} "
                            "BEGIN SELECT RAISE(ABORT, 'index refused'); END")
        else:
            schema = cache.partition(".")[0]
            durable.execute(f"CREATE FUNCTION {schema}.refuse_index() RETURNS trigger AS $$ BEGIN "
                            "RAISE EXCEPTION 'index refused'; END $$ LANGUAGE plpgsql")
            durable.execute(f"CREATE TRIGGER refuse_index BEFORE INSERT ON {cache} FOR EACH ROW "
                            f"EXECUTE FUNCTION {schema}.refuse_index()")
        journal.append(_succeeded("r", "a", T0 + 1, ref, cache_key="k"))
        journal.append(_succeeded("r", "b", T0 + 2, ref))
        with pytest.raises(JournalError, match="index refused"):
            await journal.flush()
        with pytest.raises(JournalError):
            await journal.close()
    events = durable.table("events")
    assert durable.execute(f"SELECT run_id FROM {events} ORDER BY pos") == [("before",)]
    assert durable.count("cache") == 0


async def test_read_in_pages_of_limit_events_gives_every_event_once_in_order(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        for i in range(23):
            journal.append(ev("a" if i % 3 else "b", i, "step_failed" if i % 4 == 0 else "step_started"))
        await journal.flush()
        for run_id, kind in [(None, None), ("a", None), ("b", None), (None, "step_failed"), ("a", "step_failed")]:
            everything = await journal.read(run_id, kind=kind)
            paged: list[Event] = []
            while page := await journal.read(run_id, after=paged[-1].pos or 0 if paged else 0, kind=kind, limit=4):
                assert len(page) <= 4  # a page, never more
                paged += page
            assert paged == everything, (run_id, kind)
        first = (await journal.read())[0]
        assert await journal.read(limit=1) == [first]
        assert await journal.read("no-such-run", limit=5) == []
