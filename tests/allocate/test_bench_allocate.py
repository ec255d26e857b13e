"""planweave bench allocate, small: every policy and setting is run through the engine, --json, bad options exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planweave.allocate import TierTable
from planweave.bench.allocate import SETTINGS, calibration, main, plan_of, reference, run_bench, workflow
from planweave.cli.main import app


def test_the_bench_prints_a_cell_per_shape_setting_and_policy_as_json() -> None:
    result = CliRunner().invoke(app, ["bench", "allocate", "--runs", "2", "--shapes", "codeflow,proofflow",
                                      "--policies", "cheapest,monte_carlo", "--sims", "20", "--calibration-runs", "0",
                                      "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    cells = out["cells"]
    assert len(cells) == 2 * len(SETTINGS) * 2
    assert {(c["shape"], c["policy"]) for c in cells} == {(s, p) for s in ("codeflow", "proofflow")
                                                          for p in ("cheapest", "monte_carlo")}
    for c in cells:
        assert c["runs"] == 2 and 0 <= c["completed"] <= 2 and c["fraction"] == c["completed"] / 2
        assert c["decisions"] >= 4  # every step of every run asked the allocator (retries ask again)
        assert c["mean_cost_usd"] > 0
    assert out["overhead_ms"]["monte_carlo"]["decisions"] > 0 and out["overhead_ms"]["monte_carlo"]["p50"] > 0
    calibration = out["calibration"]["monte_carlo"]
    assert calibration["runs"] == 2 * len(SETTINGS) * 2 and 0 <= calibration["brier"] <= 1
    assert sum(b["runs"] for b in calibration["bins"]) == calibration["runs"]


def test_the_workflows_are_seeded_and_their_plans_are_model_auto_steps() -> None:
    assert workflow("codeflow", 3) == workflow("codeflow", 3) != workflow("codeflow", 4)
    steps = workflow("proofflow", 1)
    plan = plan_of(steps, "proofflow")
    assert all(s["args"]["model"] == "auto" and s["args"]["select"] == "vote" for s in plan["steps"])
    cost, seconds = reference(steps)
    assert cost > 0 and seconds > 0
    assert isinstance(steps[0].table(), TierTable)


@pytest.mark.parametrize("args", [["--shapes", "nope"], ["--policies", "best"], ["--runs", "0"]])
def test_bad_options_exit_2_naming_them(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_the_same_seed_replays_the_same_runs() -> None:
    def once() -> list[tuple[int, float]]:
        out = run_bench(runs=2, shapes=["codeflow"], policies=["monte_carlo"], sims=20,
                        settings=[("tight", 1.0, 1.0)], seed=5)
        return [(c["completed"], c["mean_cost_usd"]) for c in out["cells"]]

    assert once() == once()


def test_the_calibration_counts_the_tables_runs_and_runs_more_to_reach_its_count() -> None:
    out = run_bench(runs=1, shapes=["codeflow"], policies=["monte_carlo"], sims=20, settings=[("tight", 1.0, 1.0)],
                    calibration_runs=3)
    cal = out["calibration_runs"]
    assert (cal["runs"], cal["from_table"], cal["extra_runs"]) == (3, 1, 2)
    assert sum(b["runs"] for b in cal["bins"]) == 3 and 0 <= cal["brier"] <= 1
    assert "calibration_runs" not in run_bench(runs=1, shapes=["codeflow"], policies=["monte_carlo"], sims=20,
                                               settings=[("tight", 1.0, 1.0)])


def test_calibration_is_the_brier_score_and_bins_within_two_standard_errors() -> None:
    calibrated = calibration([(0.9, True)] * 9 + [(0.9, False)], bins=10)
    assert calibrated["brier"] == pytest.approx((9 * 0.01 + 0.81) / 10)
    (only,) = calibrated["bins"]
    assert (only["p_lo"], only["runs"], only["predicted"], only["observed"], only["within_2se"]) == (
        0.9, 10, 0.9, 0.9, True)
    wrong = calibration([(0.9, False)] * 10, bins=10)
    assert wrong["brier"] == pytest.approx(0.81) and wrong["bins"][0]["within_2se"] is False
    assert calibration([(0.3, True), (0.5, False)], bins=10)["brier_base"] == 0.25
