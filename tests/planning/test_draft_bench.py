"""``planweave bench speculate --planning``: the plain planner vs draft + verify, results identical in every row."""

from __future__ import annotations

import json
import random

import pytest

from planweave.bench.draft_planning import draft_of, run_planning_bench, workload
from planweave.bench.speculate import main


def test_the_draft_agrees_for_a_geometric_prefix_then_diverges() -> None:
    plan = workload(1, 6)
    draft, agree = draft_of(plan, 1.0, random.Random(0))
    assert (draft, agree) == (plan, 6)
    draft, agree = draft_of(plan, 0.0, random.Random(0))
    assert agree == 0 and all(d["args"] != s["args"] for d, s in zip(draft, plan, strict=True))


def test_a_fully_agreeing_draft_calls_the_first_tool_sooner_and_changes_no_result() -> None:
    result = run_planning_bench(seeds=1, steps=3, agreements=(0.0, 1.0))
    rows = {(r["p"], r["variant"]): r for r in result["rows"]}
    assert all(r["results_differ"] == 0 for r in rows.values())
    assert rows[(1.0, "draft")]["first_call_s"] < 0.5 < 1.0 < rows[(1.0, "plain")]["first_call_s"]
    assert rows[(1.0, "draft")]["wasted_tool_calls"] == 0 and rows[(1.0, "draft")]["extra_model_calls"] == 1
    assert rows[(0.0, "draft")]["first_call_s"] == rows[(0.0, "plain")]["first_call_s"]  # nothing adopted
    assert rows[(0.0, "draft")]["adopted"] == 0


def test_the_planning_section_prints_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--planning", "--seeds", "1", "--steps", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["planning"]["rows"]
    assert {(r["p"], r["variant"]) for r in rows} == {(p, v) for p in (0.0, 0.3, 0.6, 0.9) for v in ("plain", "draft")}
    assert all("results_differ" in r for r in rows)
