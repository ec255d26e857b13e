"""Memory is admitted only after verification and only admitted entries reach a planner: a skill is replayed
through the engine, a lesson's check step is run; a failing one is rejected (kept, never retrieved)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine
from planweave.limits import RunLimits
from planweave.memory import Candidate, InMemoryStore, MemoryRecall, MemoryStoreError, RecallLimits, memory_prompt, rank
from planweave.memory.verify import admit_by_person, verify, verify_all
from planweave.models.openai import OpenAIChatClient
from planweave.planning.factory import build_planning_loop
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.timing import on_virtual_clock


def weather_tools(calls: list[str]) -> Toolbox:
    box = builtin_tools()

    async def forecast(city: str) -> dict[str, Any]:
        """The weather forecast of a city; fails for a city that does not exist."""
        calls.append(city)
        await asyncio.sleep(0.5)
        if city == "atlantis":
            raise LookupError(f"no such city: {city}")
        return {"city": city, "temp": len(city) * 3}

    box.add(forecast, idempotent=True)
    return box


def skill(name: str, city: str, text: str = "report the weather forecast of a city") -> Candidate:
    return Candidate("skill", name, text, ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},),
                     {"city": city}, run_id="run-0", step_ids=("look",))


def lesson(name: str, text: str, check: dict[str, Any] | None) -> Candidate:
    return Candidate("lesson", name, text, check=check, run_id="run-0")


@on_virtual_clock
async def test_only_entries_whose_verification_succeeds_are_admitted_and_retrieved() -> None:
    calls: list[str] = []
    store = InMemoryStore()
    good = await store.add(skill("city-weather", "oslo"))
    broken = await store.add(skill("atlantis-weather", "atlantis", "report the weather forecast of atlantis city"))
    checked_ok = await store.add(lesson("forecast-units", "the forecast tool reports weather temp in C",
                                        {"tool": "forecast", "args": {"city": "rome"},
                                         "expect": {"path": "temp", "equals": 12}}))
    checked_bad = await store.add(lesson("forecast-atlantis", "the weather forecast of atlantis works",
                                         {"tool": "forecast", "args": {"city": "atlantis"},
                                          "expect": {"path": "temp", "equals": 24}}))
    unchecked = await store.add(lesson("forecast-slow", "the weather forecast tool is slow", None))
    async with open_engine("memory://", tools=weather_tools(calls), clock=VirtualClock()) as engine:
        after = await verify_all(engine, store, [good, broken, checked_ok, checked_bad, unchecked])
    assert [e.status for e in after] == ["admitted", "rejected", "admitted", "rejected", "candidate"]
    assert "replay run" in after[1].note and "no such city: atlantis" in after[1].note
    assert sorted(calls) == ["atlantis", "atlantis", "oslo", "rome"]  # each replay and check really ran
    # The rejected entries are kept for audit but never retrieved, even for a query made of their own words.
    recall = MemoryRecall(store, RecallLimits(k=10, max_chars=10_000))
    text = await recall("the weather forecast of atlantis city")
    assert sorted(recall.last) == [good.id, checked_ok.id]
    assert "atlantis-weather" not in text and "forecast-atlantis" not in text and "forecast-slow" not in text
    assert {e.status for e in await store.entries()} == {"admitted", "rejected", "candidate"}


async def test_a_lesson_without_a_check_is_admitted_by_a_person_only() -> None:
    store = InMemoryStore()
    plain = await store.add(lesson("slow", "the forecast tool is slow", None))
    checked = await store.add(lesson("units", "temps are in C", {"tool": "forecast", "args": {"city": "rome"},
                                                                 "expect": {"path": "unit", "equals": "C"}}))
    cannot_fail = await store.add(lesson("units-2", "temps are in C", {"tool": "noop", "args": {}}))
    a_skill = await store.add(skill("city-weather", "oslo"))
    assert (await admit_by_person(store, plain.id, "ana")).note == "approved by ana"
    assert (await admit_by_person(store, cannot_fail.id, "ana")).status == "admitted"  # its check is no check
    with pytest.raises(MemoryStoreError, match="carries a check step"):
        await admit_by_person(store, checked.id)
    with pytest.raises(MemoryStoreError, match="admitted only by replaying it"):
        await admit_by_person(store, a_skill.id)
    with pytest.raises(MemoryStoreError, match="is admitted: only a candidate"):
        await admit_by_person(store, plain.id)


@on_virtual_clock
async def test_an_invalid_sub_plan_is_rejected_not_admitted() -> None:
    store = InMemoryStore()
    entry = await store.add(Candidate("skill", "ghost", "uses a tool that does not exist",
                                      ({"id": "a", "tool": "no.such.tool", "args": {}},)))
    async with open_engine("memory://", clock=VirtualClock()) as engine:
        after = await verify(engine, store, entry)
    assert after.status == "rejected" and "could not start" in after.note and "no.such.tool" in after.note


async def test_retrieval_ranks_the_entry_sharing_the_rarer_words_first() -> None:
    store = InMemoryStore()
    entries = [await store.add(c) for c in (
        skill("city-weather", "oslo", "report the weather forecast of a city"),
        lesson("invoice-pdf", "render an invoice as pdf before emailing it", None),
        lesson("weather-rain", "the weather service says rain when unsure", None),
        lesson("deploy-canary", "deploy a canary before the full rollout", None),
    )]
    for e in entries:
        await store.set_status(e.id, "admitted")
    admitted = await store.entries(status="admitted")
    assert [e.name for e, _ in rank("forecast the weather of Lisbon", admitted, 3)] == ["city-weather",
                                                                                         "weather-rain"]
    assert [e.name for e, _ in rank("email the invoice", admitted, 3)] == ["invoice-pdf"]
    assert rank("quantum chromodynamics", admitted, 3) == []
    assert [e.name for e, _ in rank("weather", admitted, 1)] == ["city-weather"]  # k bounds it (it says it twice)


async def test_the_prompt_section_is_bounded_in_characters() -> None:
    store = InMemoryStore()
    entries = [await store.add(lesson(f"l{i}", "word " * 60, None)) for i in range(5)]
    text, used = memory_prompt(entries, 800)
    assert len(text) <= 800 and 1 <= len(used) < 5
    text, used = memory_prompt(entries[:1], 320)
    assert len(text) <= 320 and text.endswith("[...cut]\n</memory-data>") and len(used) == 1
    assert memory_prompt(entries, 100) == ("", [])  # not even the head and the fence fit: nothing


def _planner(seen: list[str]) -> Any:
    def reply(req: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in req.messages)
        if "If the results answer the goal" in text:
            return Text('{"answer": "done"}')
        seen.append(text)
        return Text(plan_lines([{"id": "look", "tool": "forecast", "args": {"city": "lisbon"}}]))
    return reply


@on_virtual_clock
async def test_the_planner_prompt_carries_recalled_admitted_entries_and_counts_their_use() -> None:
    calls: list[str] = []
    store = InMemoryStore()
    admitted = await store.add(skill("city-weather", "oslo"))
    await store.set_status(admitted.id, "admitted", "replayed")
    rejected = await store.add(skill("city-weather-v0", "atlantis"))
    await store.set_status(rejected.id, "rejected", "replay failed")
    seen: list[str] = []
    tools = weather_tools(calls)
    async with ScriptedLLM(_planner(seen)) as base_url, \
            OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = build_planning_loop(engine, client, tools, RunLimits(), memory=MemoryRecall(store))
        result = await loop.run("the weather forecast for lisbon")
        plain = build_planning_loop(engine, client, tools, RunLimits())
        await plain.run("the weather forecast for lisbon")
    assert result.ok
    assert "skill 'city-weather' v1" in seen[0] and '"city":"${city}"' in seen[0]
    assert "city-weather-v0" not in seen[0]
    assert "Memory from earlier runs" not in seen[1]
    assert (await store.get(admitted.id)).uses == 1 and (await store.get(rejected.id)).uses == 0


def test_retrieval_without_the_memory_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from planweave import extras
    from planweave.extras import MissingExtra
    from planweave.memory.model import MemoryEntry

    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module != "rank_bm25" and real(module))
    entry = MemoryEntry(1, "lesson", "l", "weather words", 1, "admitted", 0, 0.0)
    with pytest.raises(MissingExtra, match=r"needs the 'memory' extra: pip install 'planweave\[memory\]'"):
        rank("weather", [entry], 3)
