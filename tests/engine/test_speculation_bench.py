"""``planweave bench speculate``: every row of the table, and no result differs from the run without speculation."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planweave.bench.speculate import ACCURACIES, MODES, run_bench, true_replies, with_predictions, workload
from planweave.cli.main import app


def test_predictions_are_right_with_the_accuracy_asked() -> None:
    doc = workload(3, 40)
    truth = true_replies(doc)
    right = [s["predict"]["text"] == truth[s["id"]] for s in with_predictions(doc, 1.0, 3)["steps"]]
    wrong = [s["predict"]["text"] == truth[s["id"]] for s in with_predictions(doc, 0.0, 3)["steps"]]
    assert all(right) and not any(wrong)


def test_every_row_is_measured_and_no_result_differs() -> None:
    result = run_bench(seeds=1, steps=5, ttft=0.02, tps=2000.0)
    rows = result["rows"]
    assert {(r["p"], r["mode"]) for r in rows} == {(p, m) for p in ACCURACIES for m in MODES}
    assert [r["results_differ"] for r in rows] == [0] * len(rows)
    off = [r for r in rows if r["mode"] == "off"]
    assert all(r["extra_calls"] == 0 and r["started"] == 0 for r in off)


def test_the_command_prints_json_rows_with_results_differ() -> None:
    shown = CliRunner().invoke(app, ["bench", "speculate", "--seeds", "1", "--steps", "3", "--ttft", "0.01",
                                     "--tps", "5000", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["rows"]
    assert len(rows) == len(ACCURACIES) * len(MODES)
    assert all("results_differ" in r for r in rows)
