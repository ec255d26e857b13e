"""`planweave bench admission` on a tiny workload: both modes run, every run succeeds, --json is one object."""

from __future__ import annotations

import json

import pytest

from planweave.bench.admission import main


def test_the_admission_benchmark_runs_both_modes_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--runs", "6", "--rate", "100", "--ttft", "0.01", "--tps", "2000", "--knee", "2",
                 "--hard-limit", "4", "--fixed", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    modes = {m["mode"]: m for m in out["modes"]}
    assert set(modes) == {"fixed", "adaptive"}
    for m in modes.values():
        assert m["succeeded"] == 6 and m["calls_ok"] == 24  # 4 llm steps per run, each answered once


def test_an_unknown_mode_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--modes", "fixed,fastest"])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert "--modes: unknown mode 'fastest': choose from fixed, knee, adaptive" in err
