"""``planweave bench cache`` on a tiny workload: both tables come out, the cached second run calls no tool."""

from __future__ import annotations

import json

import pytest

from planweave.bench.cache import main


def test_the_cache_benchmark_prints_both_tables_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--steps", "5", "--step-ms", "1", "--overhead-steps", "20", "--repeats", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    reuse = out["reuse"]
    assert reuse["ok"] and reuse["second_cached_calls"] == 0 and reuse["second_no_cache_calls"] == 5
    assert {(r["shape"], r["case"]) for r in out["overhead"]} == {
        (shape, case) for shape in ("chain", "fan-out")
        for case in ("not cacheable", "cacheable, cache off", "cacheable, miss lookups")}
    assert set(out["hook_ns_per_attempt"]) == {"no_tool_declares_cache", "some_tool_declares_cache"}


def test_a_bad_option_exits_2() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--steps", "0"])
    assert exited.value.code == 2
