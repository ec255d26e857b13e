"""Checking a plan file reports every problem at once, schema and semantic, each at its line and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planweave import builtin_tools
from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.core.plan.document import Positions, in_plan_order, path_parts
from planweave.core.plan.graph import check_plan_document
from planweave.planfile import check_plan_file, document_positions, load_plan_file

# Two schema problems (a timeout that is no number, retries below 0) and three semantic ones (arguments the tool
# refuses, an unknown tool, a reference to an unknown step): lines as numbered on the right.
FIVE_PROBLEMS = """\
name: five problems
steps:
  - id: fetch
    tool: http.get
    args:
      url: https://example.com
    timeout: soon
  - id: wait
    tool: sleep
    args:
      seconds: forever
  - id: parse
    tool: noop
    args:
      text: ${fetch.body}
    retries: -1
  - id: summarise
    tool: summarize
    after: [parse]
  - id: report
    tool: noop
    args:
      summary: ${summary.text}
"""
# (step, field, line, column) of each, in plan order
FIVE_PLACES = [
    ("fetch", "timeout", 7, 5),
    ("wait", "args.seconds", 11, 7),
    ("parse", "retries.max", 16, 5),
    ("summarise", "tool", 18, 5),
    ("report", "args", 23, 7),  # the argument holding the reference
]


def places(problems: tuple[PlanProblem, ...] | list[PlanProblem]) -> list[tuple[str, str, int | None, int | None]]:
    return [(p.step, p.field, p.line, p.column) for p in problems]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_schema_and_semantic_problems_come_together_each_at_its_line(tmp_path: Path) -> None:
    check = check_plan_file(write(tmp_path / "five.yaml", FIVE_PROBLEMS), builtin_tools())
    assert places(check.problems) == FIVE_PLACES
    assert (check.valid, check.readable, check.steps) == (False, True, 5)
    messages = [p.message for p in check.problems]
    assert "valid number" in messages[0]
    assert "greater than or equal to 0" in messages[2]
    assert messages[3] == "unknown tool 'summarize'"
    assert messages[4] == "${summary.text} refers to unknown step 'summary' (did you mean 'summarise'?)"


def test_a_json_plan_file_is_placed_too(tmp_path: Path) -> None:
    document = yaml.safe_load(FIVE_PROBLEMS)
    path = write(tmp_path / "five.json", json.dumps(document, indent=2))
    lines = path.read_text(encoding="utf-8").splitlines()
    check = check_plan_file(path, builtin_tools())
    assert [(p.step, p.field) for p in check.problems] == [(s, f) for s, f, _, _ in FIVE_PLACES]
    written = ['"timeout"', '"seconds"', '"retries"', '"tool": "summarize"', '"summary"']
    for problem, text in zip(check.problems, written, strict=True):
        assert problem.line is not None and problem.column is not None
        assert lines[problem.line - 1][problem.column - 1:].startswith(text), (problem, text)


def test_a_step_with_schema_problems_is_still_known_to_the_steps_naming_it() -> None:
    # 'fetch' has a bad timeout: 'use' refers to it and comes after it; neither is reported as unknown, and the
    # tool check still runs on the stand-in's arguments (http.get without its url).
    data = {"steps": [
        {"id": "fetch", "tool": "http.get", "args": {}, "timeout": "soon"},
        {"id": "use", "tool": "noop", "args": {"x": "${fetch.body}"}, "after": ["fetch"]},
    ]}
    check = check_plan_document(data, builtin_tools())
    assert [(p.step, p.field) for p in check.problems] == [("fetch", "timeout"), ("fetch", "args.url")]


def test_a_step_missing_its_tool_reports_that_once() -> None:
    check = check_plan_document({"steps": [{"id": "a"}, {"id": "b", "tool": "noop", "after": ["a"]}]},
                                builtin_tools())
    assert [(p.step, p.field) for p in check.problems] == [("a", "tool")]


def test_problems_of_the_plan_keys_and_of_steps_without_id_are_placed(tmp_path: Path) -> None:
    text = "concurrency: 0\nsteps:\n  - tool: noop\n  - id: b\n    tool: noop\n    after: [a, b]\n"
    check = check_plan_file(write(tmp_path / "p.yaml", text), builtin_tools())
    assert places(check.problems) == [
        ("", "concurrency", 1, 1),
        ("#1", "id", 3, 5),
        ("b", "after[0]", 6, 13),
        ("b", "after[1]", 6, 16),
    ]


def test_a_repeated_id_is_placed_at_the_repetition(tmp_path: Path) -> None:
    text = "steps:\n  - id: a\n    tool: noop\n  - id: a\n    tool: noop\n"
    check = check_plan_file(write(tmp_path / "p.yaml", text), builtin_tools())
    assert places(check.problems) == [("a", "id", 4, 5)]


def test_keys_merged_from_an_anchor_are_placed_where_they_are_written(tmp_path: Path) -> None:
    text = ("base: &base {tool: noop, retries: -1}\n"  # not a plan key: reported too
            "steps:\n"
            "  - <<: *base\n"
            "    id: a\n")
    check = check_plan_file(write(tmp_path / "p.yaml", text), builtin_tools())
    assert places(check.problems) == [("", "base", 1, 1), ("a", "retries.max", 1, 26)]


def test_a_syntax_error_is_one_problem_at_its_position(tmp_path: Path) -> None:
    check = check_plan_file(write(tmp_path / "p.yaml", "steps:\n  - id: a\n    tool: [noop\n"), builtin_tools())
    assert len(check.problems) == 1
    problem = check.problems[0]
    assert problem.line is not None and problem.message.startswith(f"line {problem.line}, ")
    assert str(problem) == problem.message  # the position is said once
    assert problem.detail == problem.message.removeprefix(f"line {problem.line}, column {problem.column}: ")
    assert not problem.detail.startswith("line ")
    assert check.readable


def test_a_missing_file_is_unreadable(tmp_path: Path) -> None:
    check = check_plan_file(tmp_path / "missing.yaml", builtin_tools())
    assert (check.readable, check.valid, check.steps) == (False, False, 0)
    assert "cannot read the file" in check.problems[0].message


def test_a_valid_file_has_no_problems(tmp_path: Path) -> None:
    text = "steps:\n  - id: a\n    tool: noop\n  - id: b\n    tool: sleep\n    args: {seconds: 0}\n    after: [a]\n"
    check = check_plan_file(write(tmp_path / "p.yaml", text), builtin_tools())
    assert (check.valid, check.steps, check.problems) == (True, 2, ())


def test_load_plan_file_places_its_schema_problems(tmp_path: Path) -> None:
    with pytest.raises(PlanInvalid) as raised:
        load_plan_file(write(tmp_path / "five.yaml", FIVE_PROBLEMS))
    assert places(raised.value.problems) == [FIVE_PLACES[0], FIVE_PLACES[2]]
    assert "  - line 7, column 5: step 'fetch', timeout: " in str(raised.value)


def test_a_path_falls_back_to_the_nearest_place_above_it() -> None:
    positions = Positions({("steps",): (1, 1), ("steps", "0"): (2, 5), ("steps", "0", "args"): (4, 5)})
    assert positions.of(0, "args.a.b[2]") == (4, 5)
    assert positions.of(0, "retries.max") == (2, 5)
    assert positions.of(None, "capacities.gpu") is None
    assert path_parts("steps[3].args.url") == ("steps", "3", "args", "url")
    assert path_parts("retry.on.0") == ("retry", "on", "0")


def test_problems_without_a_position_come_first_then_in_file_order() -> None:
    late, early, nowhere = PlanProblem("b", "", "x", 9, 1), PlanProblem("a", "", "y", 2, 3), PlanProblem("", "", "z")
    assert in_plan_order([late, early, nowhere]) == [nowhere, early, late]


def test_yaml_and_json_positions_agree_on_keys_and_items() -> None:
    document = {"steps": [{"id": "a", "tool": "noop", "after": ["x", "y"]}]}
    as_json = document_positions(json.dumps(document, indent=1), as_json=True)
    as_yaml = document_positions(yaml.safe_dump(document, sort_keys=False), as_json=False)
    for path in [("steps",), ("steps", "0"), ("steps", "0", "tool"), ("steps", "0", "after", "1")]:
        assert as_json.at(path) is not None and as_yaml.at(path) is not None, path
