"""`planweave bench durability --quick`: planweave, SIGKILLed at seeded points, neither repeats nor loses an effect.

Only what holds whatever the timing is asserted: planweave never writes a plain (non-idempotent) effect twice, never
reports a run finished with an effect missing, and every killed run is either finished by its resume or stopped for
a person because a step it could not vouch for had already had its effect. Which runs land in which case depends
on where the kill falls and is not asserted; nor are the peers' figures.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
import pytest

from planweave.bench.durability import SYSTEMS, System, _skip_reason, main, schedule
from planweave.extras import installed

PG_DEFAULT = "postgresql://127.0.0.1:5432/test"


def _quick(system: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(["--quick", "--systems", system, "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    [result] = out["systems"]
    assert result["skipped"] is None, result["skipped"]
    summary: dict[str, Any] = result["summary"]
    summary["outcomes"] = [(run["kill"], run["outcome"], run["detail"]) for run in result["runs"]]
    summary["versions"] = result["versions"]
    return summary


def _assert_planweave_kept_its_promise(summary: dict[str, Any]) -> None:
    # Every other run is killed by count, which lands before the join (a kill by time may come after the end).
    assert summary["killed"] >= (summary["runs"] + 1) // 2 >= 1
    assert (summary["duplicated_plain"], summary["duplicated_keyed"], summary["lost"]) == (0, 0, 0)
    outcomes = {outcome for _, outcome, _ in summary["outcomes"]}
    assert outcomes <= {"completed", "marked_done", "not_recorded", "not_killed"}, summary["outcomes"]
    assert "planweave" in summary["versions"]


def test_planweave_on_sqlite_repeats_and_loses_no_effect(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_planweave_kept_its_promise(_quick("planweave-sqlite", capsys))


@pytest.mark.postgres
def test_planweave_on_postgres_repeats_and_loses_no_effect(capsys: pytest.CaptureFixture[str]) -> None:
    base = os.environ.get("PLANWEAVE_TEST_PG", PG_DEFAULT)
    try:
        psycopg.connect(base, connect_timeout=5).close()
    except psycopg.Error as exc:
        if os.environ.get("PLANWEAVE_SKIP_PG") == "1":
            pytest.skip(f"PostgreSQL at {base} unreachable and PLANWEAVE_SKIP_PG=1: {exc}")
        pytest.fail(f"PostgreSQL at {base} is unreachable ({exc}); set PLANWEAVE_SKIP_PG=1 to skip this test")
    _assert_planweave_kept_its_promise(_quick("planweave-postgres", capsys, "--pg", base, "--runs", "2"))


def test_every_system_gets_the_same_seeded_schedule() -> None:
    assert schedule(7, 4, 4) == schedule(7, 4, 4)
    assert schedule(7, 4, 4) != schedule(8, 4, 4)
    kills = schedule(7, 6, 5)
    assert all(len(k.durations_ms) == 5 for k in kills)
    assert [k.after_effects is None for k in kills] == [False, True] * 3  # by count, then by time


def test_a_peer_that_is_not_installed_is_skipped_naming_the_extra() -> None:
    absent = System("absent", "Absent", "planweave.bench.durability_dbos", ("no_such_module_here",), "sqlite", ())
    reason = _skip_reason(absent, pg_version=None)
    assert reason == "not installed (module 'no_such_module_here'): pip install -e '.[bench]'"
    needs_pg = SYSTEMS["planweave-postgres"]
    assert _skip_reason(needs_pg, pg_version=None) == "the PostgreSQL server is not reachable (--pg)"


@pytest.mark.skipif(not installed("langgraph.checkpoint.sqlite"), reason="the [bench] extra is not installed")
def test_langgraph_runs_the_same_schedule_and_is_counted(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _quick("langgraph-sqlite", capsys, "--runs", "2")
    assert summary["runs"] == 2 and summary["killed"] == 2
    assert "langgraph" in summary["versions"]


def test_an_unknown_system_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--systems", "planweave-sqlite,temporal"])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert "unknown system 'temporal'" in err
