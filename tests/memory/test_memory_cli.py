"""``planweave memory ...`` on a real SQLite journal: listing, showing, verifying, admitting, retiring, exporting,
and clear errors (exit 2, no traceback) for unknown ids, bad options and missing journals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from planweave.cli.main import app
from planweave.memory import Candidate, MemoryEntry, open_memory_store

TOOLS = "tests.memory.memory_tools:toolbox"


def invoke(*args: str) -> Any:
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None}).invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def seed(url: str) -> list[MemoryEntry]:
    async def go() -> list[MemoryEntry]:
        async with open_memory_store(url) as store:
            return [await store.add(c) for c in (
                Candidate("skill", "city-weather", "report a city's weather",
                          ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},), {"city": "oslo"},
                          run_id="run-7", step_ids=("look",)),
                Candidate("skill", "atlantis-weather", "report atlantis' weather",
                          ({"id": "look", "tool": "forecast", "args": {"city": "${city}"}},), {"city": "atlantis"}),
                Candidate("lesson", "slow-forecast", "the forecast tool is slow", run_id="run-7"),
            )]
    return asyncio.run(go())


def test_verify_admits_a_replayed_skill_and_rejects_a_failing_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    good, bad, _lesson = seed(url)
    ok = invoke("memory", "verify", str(good.id), "--tools", TOOLS, "--journal", url)
    assert ok.exit_code == 0, ok.output
    assert "admitted" in ok.output
    failed = invoke("memory", "verify", str(bad.id), "--tools", TOOLS, "--journal", url, "--json")
    assert failed.exit_code == 1
    shown = json.loads(failed.stdout)
    assert shown["status"] == "rejected" and "no such city" in shown["note"]
    listed = json.loads(invoke("memory", "list", "--status", "admitted", "--journal", url, "--json").stdout)
    assert [e["name"] for e in listed] == ["city-weather"]
    assert listed[0]["provenance"] == {"run_id": "run-7", "step_ids": ["look"]}
    runs = json.loads(invoke("runs", "--journal", url, "--json").stdout)
    assert len(runs["runs"] if isinstance(runs, dict) else runs) == 2  # each replay is a run in the journal


def test_admit_retire_show_and_export(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    a_skill, _, lesson = seed(url)
    assert invoke("memory", "admit", str(lesson.id), "--by", "ana", "--journal", url).exit_code == 0
    refused = invoke("memory", "admit", str(a_skill.id), "--journal", url)
    assert refused.exit_code == 2 and "admitted only by replaying it" in refused.output
    shown = invoke("memory", "show", str(lesson.id), "--journal", url)
    assert "admitted (approved by ana)" in shown.output and "run run-7" in shown.output
    assert invoke("memory", "retire", str(lesson.id), "--reason", "outdated", "--journal", url).exit_code == 0
    again = invoke("memory", "retire", str(lesson.id), "--journal", url)
    assert again.exit_code == 2 and "already retired" in again.output
    out = tmp_path / "memory.jsonl"
    assert invoke("memory", "export", "--journal", url, "-o", str(out)).exit_code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["name"], e["status"], e["note"]) for e in lines][2] == ("slow-forecast", "retired", "outdated")
    table = invoke("memory", "list", "--journal", url)
    assert "city-weather" in table.output and "retired" in table.output


def test_unknown_ids_bad_options_and_missing_journals_are_clear_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    seed(url)
    for command in (["show", "99"], ["retire", "99"], ["admit", "99"], ["verify", "99"]):
        result = invoke("memory", *command, "--journal", url)
        assert result.exit_code == 2, command
        assert "no memory entry 99" in result.output and "Traceback" not in result.output
    as_json = invoke("memory", "show", "99", "--journal", url, "--json")
    doc = json.loads(as_json.stdout)
    assert doc["status"] == "error" and "no memory entry 99" in doc["error"]
    bad = invoke("memory", "list", "--status", "kept", "--journal", url)
    assert bad.exit_code == 2 and "--status kept: use one of candidate, admitted, rejected, retired" in bad.output
    missing = invoke("memory", "list", "--journal", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.exit_code == 2 and "no journal at" in missing.output
    assert not (tmp_path / "none.db").exists()
    not_a_number = invoke("memory", "show", "abc", "--journal", url)
    assert not_a_number.exit_code == 2
