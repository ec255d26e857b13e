"""``planweave validate`` and the positions in ``planweave run``'s invalid-plan report, on real processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.plan.test_validate_document import FIVE_PLACES, FIVE_PROBLEMS

from .test_cli import cli_command, subprocess_env

VALID = "steps:\n  - id: a\n    tool: noop\n  - id: b\n    tool: greet\n    args: {name: ada}\n    after: [a]\n"
TOOLS = '''\
from planweave import Toolbox

toolbox = Toolbox()


@toolbox.tool
def greet(name: str) -> str:
    """Say hello."""
    return f"hello {name}"
'''


def planweave(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=subprocess_env(), timeout=60,
                          check=False, cwd=cwd)


def one_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)  # exactly one JSON document


def test_validate_reports_all_five_problems_in_one_call_with_their_lines(tmp_path: Path) -> None:
    (tmp_path / "five.yaml").write_text(FIVE_PROBLEMS, encoding="utf-8")
    proc = planweave("validate", "five.yaml", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "five.yaml:7:5: step 'fetch', timeout: Input should be a valid number, unable to parse string as a number",
        "five.yaml:11:7: step 'wait', args.seconds: Input should be a valid number, unable to parse string as a "
        "number",
        "five.yaml:16:5: step 'parse', retries.max: Input should be greater than or equal to 0",
        "five.yaml:18:5: step 'summarise', tool: unknown tool 'summarize'",
        "five.yaml:23:7: step 'report', args: ${summary.text} refers to unknown step 'summary' (did you mean "
        "'summarise'?)",
        "five.yaml: 5 problems",
    ]


def test_validate_json_is_one_object_with_every_problem_placed(tmp_path: Path) -> None:
    (tmp_path / "five.yaml").write_text(FIVE_PROBLEMS, encoding="utf-8")
    proc = planweave("validate", "five.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 1
    document = one_json(proc)
    assert set(document) == {"file", "valid", "problems"}
    assert (document["file"], document["valid"]) == ("five.yaml", False)
    assert [(p["step"], p["field"], p["line"], p["column"]) for p in document["problems"]] == FIVE_PLACES
    assert all(set(p) == {"step", "field", "line", "column", "message"} for p in document["problems"])
    assert document["problems"][3]["message"] == "unknown tool 'summarize'"


def test_a_valid_plan_exits_0_with_the_tools_given(tmp_path: Path) -> None:
    (tmp_path / "my_tools.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "ok.yaml").write_text(VALID, encoding="utf-8")
    proc = planweave("validate", "ok.yaml", "--tools", "my_tools:toolbox", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "ok.yaml: valid (2 steps)\n"), proc.stderr
    # without them, greet is unknown
    proc = planweave("validate", "ok.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.startswith("ok.yaml:5:5: step 'b', tool: unknown tool 'greet'")


def test_several_files_the_worst_exit_code_and_one_json_document(tmp_path: Path) -> None:
    (tmp_path / "five.yaml").write_text(FIVE_PROBLEMS, encoding="utf-8")
    (tmp_path / "ok.yaml").write_text(VALID.replace("greet", "noop"), encoding="utf-8")
    proc = planweave("validate", "ok.yaml", "five.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 1
    document = one_json(proc)
    assert document["valid"] is False
    assert [(f["file"], f["valid"], len(f["problems"])) for f in document["files"]] == [
        ("ok.yaml", True, 0), ("five.yaml", False, 5)]
    proc = planweave("validate", "ok.yaml", "missing.yaml", cwd=tmp_path)
    assert proc.returncode == 2  # a file that cannot be read
    assert proc.stdout.splitlines() == [
        "ok.yaml: valid (2 steps)", "missing.yaml: cannot read the file: No such file or directory"]


def test_an_unimportable_tools_module_exits_2(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(VALID, encoding="utf-8")
    proc = planweave("validate", "ok.yaml", "--tools", "no_such_module:toolbox", "--json", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_json(proc)["status"] == "error"


def test_runs_invalid_plan_report_places_each_problem(tmp_path: Path) -> None:
    (tmp_path / "five.yaml").write_text(FIVE_PROBLEMS, encoding="utf-8")
    semantic = FIVE_PROBLEMS.replace("timeout: soon", "timeout: 5").replace("retries: -1", "retries: 1")
    (tmp_path / "semantic.yaml").write_text(semantic, encoding="utf-8")
    # the schema problems (read by the loader)
    proc = planweave("run", "five.yaml", "--journal", "memory://", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[:3] == [
        "five.yaml is not valid (2 problems):",
        "  - line 7, column 5: step 'fetch', timeout: Input should be a valid number, unable to parse string as a "
        "number",
        "  - line 16, column 5: step 'parse', retries.max: Input should be greater than or equal to 0",
    ]
    # the semantic ones (found by validate_plan, by step id), text and --json
    proc = planweave("run", "semantic.yaml", "--journal", "memory://", cwd=tmp_path)
    assert proc.returncode == 2
    assert "  - line 18, column 5: step 'summarise', tool: unknown tool 'summarize'" in proc.stderr.splitlines()
    proc = planweave("run", "semantic.yaml", "--journal", "memory://", "--json", cwd=tmp_path)
    document = one_json(proc)
    assert document["status"] == "invalid"
    semantic_places = [FIVE_PLACES[i] for i in (1, 3, 4)]
    assert [(p["step"], p["field"], p["line"], p["column"]) for p in document["problems"]] == semantic_places
    assert document["problems"][1]["text"] == "line 18, column 5: step 'summarise', tool: unknown tool 'summarize'"
