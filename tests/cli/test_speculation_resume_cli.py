"""``planweave resume --speculate``: a run speculates on resume as it was started to (``options.speculation`` in its
``run_created``) unless ``--speculate`` says otherwise; the outputs are the same either way. The run is interrupted
in this process (its engine closed mid-run, on the virtual clock) and resumed through the CLI, in process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from planweave import Engine, Event, VirtualClock, run_virtual
from planweave.cli.main import app
from planweave.journal import open_journal

PLAN = {"steps": [
    {"id": "a", "tool": "sleep", "args": {"seconds": 10, "result": {"t": 1}}, "predict": {"t": 1}},
    {"id": "b", "tool": "sleep", "args": {"seconds": 4, "result": "${a.t}"}},
]}


def interrupted(url: str, speculate: str | None) -> str:
    """A run of PLAN started (``speculate``: its --speculate) and interrupted 1 s in, while ``a`` runs."""

    async def go() -> str:
        async with open_journal(url) as journal, Engine(journal, clock=VirtualClock()) as engine:
            run = await engine.start(PLAN, run_id="r1", speculation=speculate)  # type: ignore[arg-type]
            await asyncio.sleep(1)
            return run.id

    return run_virtual(go())


def events_after_resume(url: str) -> list[Event]:
    async def read() -> list[Event]:
        async with open_journal(url) as journal:
            return list(await journal.read("r1"))

    events = run_virtual(read())
    last = max(i for i, e in enumerate(events) if e.kind == "run_resumed")
    return events[last:]


def invoke(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None}).invoke(app, list(args))


@pytest.mark.parametrize(("started", "flags", "speculates"), [
    ("safe", (), True),  # the journaled policy is honoured
    ("safe", ("--config", "speculate=off"), False),  # unless overridden
    (None, (), False),
    (None, ("--config", "speculate=safe"), True),
    ("off", ("--config", "speculate=eager"), True),
])
def test_a_resume_speculates_as_the_run_was_started_to_unless_told_otherwise(
        tmp_path: Path, started: str | None, flags: tuple[str, ...], speculates: bool) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    interrupted(url, started)
    result = invoke("resume", "r1", "--journal", url, "--virtual-clock", "--json", *flags)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded" and report["outputs"] == {"a": {"t": 1}, "b": 1}
    kinds = [(e.kind, e.step) for e in events_after_resume(url) if e.kind.startswith("speculation_")]
    assert kinds == ([("speculation_started", "b"), ("speculation_adopted", "b")] if speculates else [])
    assert report["makespan_s"] == pytest.approx(11 if speculates else 15, abs=1.5)


def test_resume_refuses_a_predictor_for_a_run_that_does_not_speculate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    interrupted(url, None)
    result = invoke("resume", "r1", "--journal", url, "--virtual-clock", "--config", "predictor_model=m")
    assert result.exit_code == 2
    assert "key 'predictor_model' applies to a run that speculates" in result.output
