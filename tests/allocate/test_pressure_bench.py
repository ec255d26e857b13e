"""planweave bench pressure, small: every deadline and policy runs through the engine, --json, bad options exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planweave.bench.pressure import DEADLINES, workflow
from planweave.cli.main import app


def test_the_bench_prints_a_cell_per_deadline_and_policy_as_json() -> None:
    result = CliRunner().invoke(app, ["bench", "pressure", "--runs", "3", "--thresholds", "off,0.5",
                                      "--forecast-runs", "20", "--json"])
    assert result.exit_code == 0, result.output
    cells = json.loads(result.stdout)["cells"]
    assert [(c["setting"], c["policy"]) for c in cells] == [(name, p) for name, _ in DEADLINES
                                                            for p in ("no pressure", "drop < 0.5")]
    for c in cells:
        assert c["runs"] == 3 and 0 <= c["completed"] <= 3 and 0 <= c["optional_done"] <= 1
    without = {c["setting"]: c for c in cells if c["policy"] == "no pressure"}
    assert all(c["fired"] == 0 for c in without.values())
    assert without["loose"]["optional_done"] == 1.0  # nothing dropped when there is time


def test_the_workflows_are_seeded_and_mark_their_extra_work_optional() -> None:
    assert workflow(3) == workflow(3) != workflow(4)
    steps = workflow(1)["steps"]
    optional = {s["id"] for s in steps if s.get("optional")}
    assert "polish" in optional and "report" not in optional and any(o.startswith("deep_") for o in optional)


def test_a_bad_threshold_exits_2_naming_it() -> None:
    result = CliRunner().invoke(app, ["bench", "pressure", "--thresholds", "off,1.5"])
    assert result.exit_code == 2
    assert "--thresholds" in result.output and "1.5" in result.output
