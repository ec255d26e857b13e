"""The MemoryStore contract, checked against every implementation (memory, SQLite, PostgreSQL) by the same tests."""

from __future__ import annotations

import pytest

from planweave.journal import open_journal
from planweave.memory import Candidate, MemoryStore, MemoryStoreError, UnknownEntry, open_memory_store
from tests.journal.conftest import Backend

from .conftest import Clock

SKILL_STEPS = ({"id": "fetch", "tool": "echo", "args": {"value": "${city}"}},
               {"id": "report", "tool": "echo", "args": {"value": "${fetch}"}})


def skill(name: str = "weather-report", text: str = "fetch a city's weather and report it") -> Candidate:
    return Candidate("skill", name, text, SKILL_STEPS, {"city": "oslo"}, run_id="run-1", step_ids=("fetch", "report"))


def lesson(name: str = "retry-geo", text: str = "the geo tool times out on first call") -> Candidate:
    return Candidate("lesson", name, text, check={"tool": "echo", "args": {"value": 1}}, run_id="run-2")


async def test_add_stores_a_candidate_with_its_provenance_version_and_time(store: MemoryStore, clock: Clock) -> None:
    entry = await store.add(skill())
    assert (entry.kind, entry.name, entry.version, entry.status, entry.uses) == (
        "skill", "weather-report", 1, "candidate", 0)
    assert entry.created_at == clock.now
    assert (entry.run_id, entry.step_ids) == ("run-1", ("fetch", "report"))
    assert [dict(s) for s in entry.steps] == [dict(s) for s in SKILL_STEPS]
    assert dict(entry.params) == {"city": "oslo"}
    assert await store.get(entry.id) == entry


async def test_the_hosts_its_source_run_used_are_kept_with_the_entry(store: MemoryStore) -> None:
    entry = await store.add(Candidate("skill", "weather-api", "the weather api", SKILL_STEPS, {"city": "oslo"},
                                      hosts=("api.weather.example", "10.0.0.7")))
    assert entry.hosts == ("api.weather.example", "10.0.0.7")
    assert (await store.get(entry.id)).hosts == entry.hosts
    assert (await store.set_status(entry.id, "admitted", "replayed")).hosts == entry.hosts
    assert entry.to_json()["hosts"] == ["api.weather.example", "10.0.0.7"]
    assert (await store.add(skill())).hosts == ()  # hand-added, no provenance: it vouches for no host


async def test_a_new_entry_of_the_same_name_is_the_next_version(store: MemoryStore) -> None:
    first = await store.add(skill())
    second = await store.add(skill(text="a better way"))
    other = await store.add(skill(name="other"))
    same_name_lesson = await store.add(lesson(name="weather-report"))
    assert (first.version, second.version, other.version, same_name_lesson.version) == (1, 2, 1, 1)
    assert len({first.id, second.id, other.id, same_name_lesson.id}) == 4


async def test_admitting_a_version_retires_the_admitted_older_one(store: MemoryStore) -> None:
    first = await store.add(skill())
    await store.set_status(first.id, "admitted", "replayed")
    second = await store.add(skill(text="a better way"))
    admitted = await store.set_status(second.id, "admitted", "replayed")
    assert admitted.status == "admitted" and admitted.note == "replayed"
    old = await store.get(first.id)
    assert old.status == "retired" and old.note == f"superseded by entry {second.id}"
    assert [e.id for e in await store.entries(status="admitted")] == [second.id]


async def test_entries_filter_by_status_and_kind_oldest_first(store: MemoryStore) -> None:
    a = await store.add(skill())
    b = await store.add(lesson())
    c = await store.add(lesson(name="another"))
    await store.set_status(c.id, "rejected", "check failed")
    assert [e.id for e in await store.entries()] == [a.id, b.id, c.id]
    assert [e.id for e in await store.entries(kind="lesson")] == [b.id, c.id]
    assert [e.id for e in await store.entries(status="candidate")] == [a.id, b.id]
    assert [e.id for e in await store.entries(status="rejected", kind="lesson")] == [c.id]
    assert (await store.get(c.id)).note == "check failed"


async def test_record_use_counts_each_entry_once_per_call(store: MemoryStore) -> None:
    a = await store.add(skill())
    b = await store.add(lesson())
    await store.record_use([a.id, b.id, a.id])
    await store.record_use([a.id])
    assert ((await store.get(a.id)).uses, (await store.get(b.id)).uses) == (2, 1)


async def test_unknown_ids_are_refused_naming_the_id(store: MemoryStore) -> None:
    with pytest.raises(UnknownEntry, match="no memory entry 404"):
        await store.get(404)
    with pytest.raises(UnknownEntry, match="no memory entry 404"):
        await store.set_status(404, "retired")
    with pytest.raises(UnknownEntry, match="no memory entry 404"):
        await store.record_use([404])


@pytest.mark.parametrize(("candidate", "problem"), [
    (Candidate("skill", "s", "no steps"), "a skill needs steps"),
    (Candidate("lesson", "bad name!", "x"), "name must be"),
    (Candidate("lesson", "empty", "  "), "text is empty"),
    (Candidate("skill", "s", "x", ({"id": "a", "tool": "echo", "args": {"value": "${nope}"}},)),
     "placeholder '\\$\\{nope\\}' is neither a parameter nor a step"),
    (Candidate("skill", "s", "x", ({"id": "a", "tool": "echo", "args": {}},), {"a": 1}),
     "parameter 'a' has the name of one of its steps"),
])
async def test_a_malformed_candidate_is_refused_naming_the_problem(store: MemoryStore, candidate: Candidate,
                                                                    problem: str) -> None:
    with pytest.raises(MemoryStoreError, match=problem):
        await store.add(candidate)
    assert await store.entries() == []


async def test_durable_entries_survive_reopening_beside_the_journal(backend: Backend, clock: Clock) -> None:
    if not backend.durable:
        pytest.skip("the memory store lives in this process only")
    async with open_journal(backend.url):  # the journal's own tables first: the memory tables sit beside them
        pass
    async with open_memory_store(backend.url, now=clock) as first:
        entry = await first.add(skill())
        await first.set_status(entry.id, "admitted", "replayed")
    async with open_journal(backend.url), open_memory_store(backend.url, now=clock) as again:
        assert [(e.id, e.status) for e in await again.entries()] == [(entry.id, "admitted")]
