"""``GET /memory`` and ``GET /memory/{id}`` on a real server over a SQLite journal: what ``planweave memory list
--json`` prints, behind the access token, 404 for an unknown id, 422 for a bad status, 501 without the extra."""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from typer.testing import CliRunner

from planweave import extras, open_engine
from planweave.cli.main import app
from planweave.memory import Candidate, MemoryEntry, open_memory_store
from planweave.server import serving
from planweave.server.app import AppState
from tests.journal.conftest import _make as make_backend

from .conftest import TOKEN, Live


def cli_json(*args: str) -> Any:
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None}).invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def seed(url: str) -> list[MemoryEntry]:
    """A skill (admitted, used twice), a lesson (candidate) and a second skill version (retired the first)."""
    async with open_memory_store(url) as store:
        skill = await store.add(Candidate(
            "skill", "city-weather", "report a city's weather",
            ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},), {"city": "oslo"},
            run_id="run-7", step_ids=("look",)))
        lesson = await store.add(Candidate("lesson", "slow-forecast", "the forecast tool is slow", run_id="run-7"))
        await store.set_status(skill.id, "admitted", "replay succeeded")
        await store.record_use([skill.id])
        await store.record_use([skill.id])
        newer = await store.add(Candidate(
            "skill", "city-weather", "report a city's weather, checked",
            ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},), {"city": "lima"},
            run_id="run-9", step_ids=("look",)))
        await store.set_status(newer.id, "admitted", "replay succeeded")
        return [await store.get(e.id) for e in (skill, lesson, newer)]


async def test_the_api_lists_what_the_cli_lists(live: Live) -> None:
    skill, lesson, newer = await seed(live.journal_url)
    async with live.client() as client:
        listed = await client.get("/memory")
        assert listed.status_code == 200, listed.text
        body = listed.json()
        cli = await asyncio.to_thread(cli_json, "memory", "list", "--journal", live.journal_url, "--json")
        assert body == cli
        assert [(e["id"], e["status"], e["uses"]) for e in body] == [
            (skill.id, "retired", 2), (lesson.id, "candidate", 0), (newer.id, "admitted", 0)]
        assert body[0]["provenance"] == {"run_id": "run-7", "step_ids": ["look"]}
        assert {"id", "kind", "name", "version", "status", "uses", "provenance", "created_at"} <= set(body[0])

        admitted = await client.get("/memory", params={"status": "admitted"})
        assert admitted.json() == await asyncio.to_thread(
            cli_json, "memory", "list", "--status", "admitted", "--journal", live.journal_url, "--json")
        assert [e["id"] for e in admitted.json()] == [newer.id]

        one = await client.get(f"/memory/{skill.id}")
        assert one.status_code == 200
        assert one.json() == await asyncio.to_thread(
            cli_json, "memory", "show", str(skill.id), "--journal", live.journal_url, "--json")

        # Entries written after the first request are seen (the store is read, not cached).
        async with open_memory_store(live.journal_url) as store:
            await store.record_use([newer.id])
        assert (await client.get(f"/memory/{newer.id}")).json()["uses"] == 1


async def test_an_unknown_entry_and_a_bad_status_are_clear_errors(live: Live) -> None:
    await seed(live.journal_url)
    async with live.client() as client:
        missing = await client.get("/memory/999")
        assert missing.status_code == 404
        assert missing.json()["detail"].startswith("no memory entry 999 in ")
        bad = await client.get("/memory", params={"status": "sleeping"})
        assert bad.status_code == 422
        assert "status 'sleeping': use one of candidate, admitted, rejected, retired" in bad.text
        assert (await client.get("/memory/x")).status_code == 422
        huge = await client.get(f"/memory/{2**90}")  # more than a database integer holds
        assert huge.status_code == 422 and "entry_id" in huge.text  # more than an id can be: refused, naming it
        assert (await client.get("/memory/-1")).status_code == 422  # ids start at 1


@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_a_missing_or_wrong_token_is_refused(live: Live, token: str | None) -> None:
    await seed(live.journal_url)
    async with live.client(token) as client:
        for path in ("/memory", "/memory/1"):
            refused = await client.get(path)
            assert refused.status_code == 401, path
            assert "access token" in refused.json()["detail"]
            assert "city-weather" not in refused.text


async def test_without_the_memory_extra_the_endpoints_answer_501(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.EXTRAS, "memory", ("planweave_no_such_module_h9",))
    async with live.client() as client:
        for path in ("/memory", "/memory/1"):
            answer = await client.get(path)
            assert answer.status_code == 501, answer.text
            assert answer.json()["detail"] == (
                "GET /memory needs the 'memory' extra: pip install 'planweave[memory]' (from a checkout of the "
                "repository: pip install '.[memory]'; module 'planweave_no_such_module_h9' is not installed)")


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or getpass.getuser()
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    for backend in make_backend("postgres", tmp_path):
        yield _with_password(backend.url, "pw-h9-secret")


@pytest.mark.postgres
async def test_a_postgresql_journal_s_memory_is_served_from_the_url_with_its_password(pg_url: str) -> None:
    # The journal reports its URL without the password: the server opens the memory store from the one it was given.
    await seed(pg_url)
    async with open_engine(pg_url) as engine, serving(engine, port=0, token=TOKEN, journal_url=pg_url,
                                                     announce=False, quiet=True) as server:
        assert "pw-h9-secret" not in engine.journal.url
        state: AppState = server.app.state.planweave
        assert state.memory is not None and state.memory.url == pg_url
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            listed = await client.get("/memory", params={"status": "retired"})
            assert listed.status_code == 200, listed.text
            assert listed.json() == await asyncio.to_thread(
                cli_json, "memory", "list", "--status", "retired", "--journal", pg_url, "--json")
            assert [(e["name"], e["uses"]) for e in listed.json()] == [("city-weather", 2)]
