"""Step outputs out through the CLI: ``run --json`` and ``show --json`` carry them, ``output`` prints one whole,
``show --step`` details one step; secrets are redacted everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .test_cli import invoke, sqlite_url, write_plan

SECRET = "sk-test-abcdef123456"
BIG = "x" * (300 * 1024)  # above the 256 KiB default limit
PLAN = {
    "name": "outputs",
    "steps": [
        {"id": "fetch", "tool": "sleep", "args": {"seconds": 0.01, "result": {"n": 2, "words": ["a", "b"]}}},
        {"id": "big", "tool": "noop", "args": {"text": BIG}},
        {"id": "use", "tool": "noop", "args": {"n": "${fetch.n}", "first": "${fetch.words[0]}"}},
        # broken waits for the others: a failure nothing repairs stops the run, cancelling steps still running
        {"id": "broken", "tool": "shell", "after": ["use", "big"],
         "args": {"argv": ["sh", "-c", "echo bad >&2; exit 3"]}},
        {"id": "after_broken", "tool": "noop", "args": {"x": "${broken.stdout}"}},
    ],
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A finished (failed) run in a SQLite journal, and its ``run --json`` object (one run for the module)."""
    tmp_path = tmp_path_factory.mktemp("outputs")
    url = sqlite_url(tmp_path)
    plan = write_plan(tmp_path / "outputs.yaml", PLAN)
    result = invoke("run", str(plan), "--journal", url, "--json", "--run-id", "out1")
    assert result.exit_code == 1, result.output
    return url, json.loads(result.stdout)


def test_run_json_carries_the_outputs_of_succeeded_steps(finished: tuple[str, dict[str, Any]]) -> None:
    _url, report = finished
    outputs = report["outputs"]
    assert set(outputs) == {"fetch", "big", "use"}
    assert outputs["fetch"] == {"n": 2, "words": ["a", "b"]}
    assert outputs["use"] == {"n": 2, "first": "a"}
    assert outputs["big"]["truncated"] is True
    assert outputs["big"]["bytes"] > 300 * 1024
    assert len(outputs["big"]["sha256"]) == 64


def test_show_json_carries_the_same_outputs(finished: tuple[str, dict[str, Any]]) -> None:
    url, report = finished
    shown = invoke("show", "out1", "--journal", url, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["outputs"] == report["outputs"]


def test_output_prints_one_whole_output_as_json(finished: tuple[str, dict[str, Any]]) -> None:
    url, report = finished
    big = invoke("output", "out1", "big", "--journal", url)
    assert big.exit_code == 0, big.output
    assert json.loads(big.stdout) == {"text": BIG}
    use = invoke("output", "out1", "use", "--journal", url)
    assert json.loads(use.stdout) == report["outputs"]["use"]


@pytest.mark.parametrize(("step", "message"), [
    ("fech", "run 'out1' has no step 'fech' (did you mean 'fetch'?)"),
    ("broken", "step 'broken' of run 'out1' has no output: it failed"),
    ("after_broken", "step 'after_broken' of run 'out1' has no output: it was skipped"),
])
def test_output_of_a_missing_or_unfinished_step_exits_1_with_a_message(
    finished: tuple[str, dict[str, Any]], step: str, message: str,
) -> None:
    url, _ = finished
    result = invoke("output", "out1", step, "--journal", url)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_output_of_an_unknown_run_exits_2(finished: tuple[str, dict[str, Any]]) -> None:
    url, _ = finished
    result = invoke("output", "nope", "fetch", "--journal", url)
    assert result.exit_code == 2
    assert "no run 'nope'" in result.stderr


def test_show_step_gives_args_attempts_error_and_output(finished: tuple[str, dict[str, Any]]) -> None:
    url, _ = finished
    use = invoke("show", "out1", "--journal", url, "--step", "use")
    assert use.exit_code == 0, use.output
    assert "'first': 'a'" in use.stdout or '"first": "a"' in use.stdout
    assert "succeeded" in use.stdout
    broken = invoke("show", "out1", "--journal", url, "--step", "broken")
    assert "failed" in broken.stdout and "exit" in broken.stdout and "attempt 1" in broken.stdout
    as_json = json.loads(invoke("show", "out1", "--journal", url, "--step", "use", "--json").stdout)
    assert as_json["args"] == {"n": 2, "first": "a"}
    assert as_json["output"] == {"n": 2, "first": "a"}
    assert [a["outcome"] for a in as_json["attempts"]] == ["succeeded"]
    skipped = json.loads(invoke("show", "out1", "--journal", url, "--step", "after_broken", "--json").stdout)
    assert skipped["args"] == {"x": "${broken.stdout}"} and skipped["output"] is None
    missing = invoke("show", "out1", "--journal", url, "--step", "fech")
    assert missing.exit_code == 1 and "did you mean 'fetch'" in missing.stderr


def test_secrets_are_redacted_in_every_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_API_KEY", SECRET)
    url = sqlite_url(tmp_path)
    plan = write_plan(tmp_path / "secret.yaml", {"steps": [
        {"id": "leak", "tool": "noop", "args": {"key": SECRET, "note": f"token={SECRET}"}},
        {"id": "echo", "tool": "noop", "args": {"again": "${leak.key}"}},
    ]})
    ran = invoke("run", str(plan), "--journal", url, "--json", "--run-id", "s1")
    shown = invoke("show", "s1", "--journal", url, "--json")
    step = invoke("show", "s1", "--journal", url, "--step", "echo", "--json")
    text = invoke("show", "s1", "--journal", url, "--step", "echo")
    whole = invoke("output", "s1", "leak", "--journal", url)
    for result in (ran, shown, step, text, whole):
        assert result.exit_code == 0, result.output
        assert SECRET not in result.stdout
    assert json.loads(ran.stdout)["outputs"]["leak"] == {"key": "***", "note": "token=***"}
    assert json.loads(step.stdout)["args"] == {"again": "***"}


def test_show_redacts_what_the_journal_holds_in_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_API_KEY", raising=False)  # the run's process knew no secret: the journal has it in clear
    url = sqlite_url(tmp_path)
    plan = write_plan(tmp_path / "clear.yaml", {"steps": [
        {"id": "leak", "tool": "noop", "args": {"key": SECRET}},
        {"id": "fail", "tool": "shell", "args": {"argv": ["sh", "-c", f"echo {SECRET} >&2; exit 1"]}},
    ], "on_failure": "continue"})
    assert invoke("run", str(plan), "--journal", url, "--json", "--run-id", "c1").exit_code == 1
    monkeypatch.setenv("DEMO_API_KEY", SECRET)  # the process showing it does
    shown = invoke("show", "c1", "--journal", url, "--json")
    text = invoke("show", "c1", "--journal", url)
    step = invoke("show", "c1", "--journal", url, "--step", "fail", "--json")
    for result in (shown, text, step):
        assert SECRET not in result.stdout
    report = json.loads(shown.stdout)
    assert report["outputs"]["leak"] == {"key": "***"}
    assert "***" in report["steps"]["fail"]["error"] and "***" in report["error"]
