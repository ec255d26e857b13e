"""The ``--json`` contract, checked on real processes: stdout holds exactly one JSON object, whatever happens."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .test_cli import cli_command, sqlite_url, subprocess_env, write_plan


def run_cli(*args: str, cwd: Path | None = None) -> tuple[int, Any, str]:
    """Run ``planweave ARGS``; return the exit code, stdout parsed as one JSON document, and stderr."""
    proc = subprocess.run(cli_command(*args), capture_output=True, text=True, env=subprocess_env(), timeout=60,
                          check=False, cwd=cwd)
    try:
        document = json.loads(proc.stdout)  # fails on anything but exactly one JSON document
    except json.JSONDecodeError as exc:
        pytest.fail(f"stdout is not one JSON document ({exc}):\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert isinstance(document, dict), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, document, proc.stderr


def test_an_invalid_plan_is_one_object_listing_every_problem(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "bad.yaml", {"steps": [
        {"id": "a", "tool": "nope"},
        {"id": "b", "tool": "noop", "args": {"x": "${missing.out}"}},
    ]})
    code, doc, stderr = run_cli("run", str(plan), "--journal", sqlite_url(tmp_path), "--json")
    assert code == 2
    assert doc["status"] == "invalid"
    assert len(doc["problems"]) == 2
    assert {p["step"] for p in doc["problems"]} == {"a", "b"}
    assert all(p["message"] for p in doc["problems"])
    assert "unknown tool 'nope'" in stderr  # people still read the problems on stderr


@pytest.mark.parametrize("name", ["broken.yaml", "missing.yaml"])
def test_an_unparseable_or_missing_plan_file_is_invalid_too(tmp_path: Path, name: str) -> None:
    (tmp_path / "broken.yaml").write_text("steps: [ {id: a, tool: noop\n", encoding="utf-8")
    plan = tmp_path / name
    code, doc, _ = run_cli("run", str(plan), "--journal", "memory://", "--json")
    assert (code, doc["status"]) == (2, "invalid")
    assert doc["source"] == str(plan)
    assert doc["problems"]


@pytest.mark.parametrize("args", [
    ("run", "{plan}", "--json", "--journal", "bogus://nowhere"),
    ("run", "{plan}", "--json", "--journal", "memory://", "--capacity", "gpu"),
    ("run", "{plan}", "--json", "--journal", "memory://", "--tools", "no_such_module:toolbox"),
    ("resume", "no-such-run", "--json", "--journal", "{journal}"),
    ("show", "no-such-run", "--json", "--journal", "{journal}"),
])
def test_a_run_that_cannot_start_is_one_error_object(tmp_path: Path, args: tuple[str, ...]) -> None:
    plan = write_plan(tmp_path / "ok.yaml", {"steps": [{"id": "a", "tool": "noop"}]})
    write_plan(tmp_path / "seed.yaml", {"steps": [{"id": "a", "tool": "noop"}]})
    journal = sqlite_url(tmp_path)
    subprocess.run(cli_command("run", str(tmp_path / "seed.yaml"), "--journal", journal, "--json"),
                   capture_output=True, env=subprocess_env(), timeout=60, check=True)
    filled = [a.format(plan=plan, journal=journal) for a in args]
    code, doc, stderr = run_cli(*filled)
    assert code == 2
    assert doc["status"] == "error"
    assert isinstance(doc["error"], str) and doc["error"]
    assert doc["error"] in stderr


def test_what_tools_print_goes_to_stderr_never_into_the_json(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "noisy.yaml", {"steps": [
        {"id": "talk", "tool": "chatty", "args": {"word": "hello"}},
        {"id": "shell", "tool": "shell", "args": {"argv": ["sh", "-c", "echo from shell; echo err >&2"]}},
    ]})
    code, doc, stderr = run_cli("run", str(plan), "--journal", "memory://", "--json", "--tools",
                                "noisy_tools:toolbox")
    assert code == 0, stderr
    assert doc["status"] == "succeeded"
    assert doc["outputs"]["talk"] == {"word": "hello"}
    assert doc["outputs"]["shell"]["stdout"].strip() == "from shell"
    for line in ("print says hello", "fd 1 says hello", "child says hello"):
        assert line in stderr


@pytest.mark.parametrize(("args", "reason"), [
    (("--bogus",), "No such option: --bogus"),
    (("--concurrency", "abc"), "Invalid value for '--concurrency'"),
])
def test_a_command_line_typer_refuses_is_one_error_object_too(
        tmp_path: Path, args: tuple[str, ...], reason: str) -> None:
    plan = write_plan(tmp_path / "p.yaml", {"steps": [{"id": "a", "tool": "noop"}]})
    code, value, err = run_cli("run", str(plan), "--journal", sqlite_url(tmp_path), "--json", *args)
    assert code == 2
    assert value["status"] == "error"
    assert reason in value["error"]
    assert reason in err  # the usual usage message still goes to stderr


def test_run_json_is_the_read_model_that_show_json_prints(tmp_path: Path) -> None:
    """``run --json`` is :func:`planweave.runview.run_report`, as ``show --json`` (which adds only the owner)."""
    plan = write_plan(tmp_path / "two.yaml", {"name": "two", "steps": [
        {"id": "talk", "tool": "noop", "args": {"word": "hello"}},
        {"id": "fail", "tool": "shell", "args": {"argv": ["false"]}},
    ], "on_failure": "continue"})
    url = sqlite_url(tmp_path)
    code, ran, _ = run_cli("run", str(plan), "--journal", url, "--json", "--virtual-clock")
    assert code == 1
    old_keys = {"run_id", "status", "started_at", "finished_at", "makespan_s", "error", "steps", "answer",
                "partial_answer", "tokens", "cost_usd", "plan_versions", "root_cause", "unbounded", "outputs"}
    assert old_keys <= set(ran)
    assert ran["plan"] == "two" and ran["waiting"] == {} and ran["root_cause"] == "fail"
    assert ran["steps"]["talk"]["attempt_log"][0]["outcome"] == "succeeded"
    _, shown, _ = run_cli("show", ran["run_id"], "--journal", url, "--json")
    assert shown.pop("owner")
    assert ran == shown
