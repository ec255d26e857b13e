"""A control run's events are its own kinds (planweave.control.events), not the engine's, and journals written when
the engine's ``EventKind`` still listed them read the same: stored as they were, resumed from, and still not a plan
run to the plan runs' readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from planweave.control import ControlLoop
from planweave.control.events import CONTROL_PAYLOADS, ControlKind
from planweave.core.clock import run_virtual
from planweave.core.events import PAYLOADS, Event, EventKind
from planweave.journal import open_journal
from planweave.journal.summary import fold_summary
from tests.control.test_loop import HOLD, Recorder, TickPolicy, run

# A control run that crashed at tick 27 after checkpoints at ticks 9 and 19, as the journal held it when the control
# kinds were still in the engine's EventKind (Event.to_json one a line, positions left to the journal).
OLD = Path(__file__).parent / "journals" / "crashed_before_control_kinds_moved.jsonl"


def old_events() -> list[Event]:
    rows: list[dict[str, Any]] = [json.loads(line) for line in OLD.read_text(encoding="utf-8").splitlines()]
    return [Event(r["run_id"], r["kind"], r["at"], r["step"], r["data"]) for r in rows]


def test_the_control_kinds_are_declared_by_control_not_by_the_engine() -> None:
    kinds = set(get_args(ControlKind))
    assert set(CONTROL_PAYLOADS) == kinds and len(kinds) == 7
    assert not kinds & set(get_args(EventKind)) and not kinds & set(PAYLOADS)
    assert all(not kind.startswith("control_") for kind in get_args(EventKind))


def test_a_journal_written_with_the_old_kinds_is_read_and_resumed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    written = old_events()

    async def store_and_read() -> list[Event]:
        async with open_journal(url) as journal:
            for event in written:
                journal.append(event)
            await journal.flush()
            return await journal.read("arm-old")

    stored = run_virtual(store_and_read())
    assert [(e.kind, e.at, e.data) for e in stored] == [(e.kind, e.at, e.data) for e in written]
    env = Recorder()
    report = run(ControlLoop(env=env, policy=TickPolicy(0.05), rate_hz=50, horizon=8, execute=4, safe_action=HOLD,
                             journal=url, checkpoint_every=10), ticks=40, resume="arm-old")
    assert report.resumed_at == 20 and env.actions[0][0] == 20 and report.ticks == 40


def test_a_control_run_is_still_no_plan_run_to_the_plan_runs_readers() -> None:
    summary = fold_summary("arm-old", old_events())
    assert summary.status == "unreadable"
    assert summary.error == ("cannot read this run: run 'arm-old': the journal starts with control_started, "
                             "not run_created")


def test_the_fold_refuses_a_control_kind_naming_it() -> None:
    from planweave.core.state import _FOLD

    assert not set(get_args(ControlKind)) & set(_FOLD)
    with pytest.raises(KeyError):
        _FOLD["control_chunk"]
