"""Reading plan files: every input either gives a plan or a `PlanError` naming the problem, never another exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import builtin_tools, validate_plan
from planweave.core.errors import PlanError, PlanInvalid
from planweave.planfile import load_plan_file

VALID_YAML = """\
name: demo
defaults: {timeout: 30, retries: 1}
steps:
  - id: a
    tool: noop
    args: {x: [1, 2, {y: "z"}]}
  - id: b
    tool: sleep
    args: {seconds: 0.01, result: "${a.x[2].y}"}
    retries: {max: 2, backoff: 0.1}
"""

# (file name, content, a text the message must contain)
NASTY: list[tuple[str, bytes, str]] = [
    ("latin1.yaml", "steps: [{id: caf\xe9, tool: noop}]".encode("latin-1"), "not UTF-8"),
    ("deep.json", b"[" * 5000 + b"]" * 5000, "nested"),
    ("deep.yaml", b"steps: " + b"[" * 5000 + b"]" * 5000, "nested"),
    ("deep_args.json", b'{"steps": [{"id": "a", "tool": "noop", "args": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}]}",
     "nested"),
    ("self.yaml", b"steps: [{id: a, tool: noop, args: {x: &a [*a]}}]", "refers to itself"),
    ("self_top.yaml", b"&a [*a]", "got a list"),
    ("bigint.json", b'{"steps": [], "concurrency": ' + b"9" * 5000 + b"}", "digits"),
    ("bigint.yaml", b"steps: []\nconcurrency: " + b"9" * 5000, "digits"),
    ("laughs.yaml", b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ) + b"steps: [{id: s, tool: noop, args: {v: *i}}]\n", "values"),
    ("surrogate.json", b'{"steps": [{"id": "a", "tool": "noop", "args": {"x": "\\ud800"}}]}', "surrogate"),
    ("surrogate_key.json", b'{"steps": [{"id": "a", "tool": "noop", "args": {"\\udfff": 1}}]}', "surrogate"),
    ("list.yaml", b"- id: a\n  tool: noop\n", "got a list"),
    ("empty.yaml", b"", "empty"),
    ("scalar.json", b"42", "got an int"),
    ("date.yaml", b"steps: [{id: a, tool: noop, args: {when: 2001-02-30}}]", ""),
    ("set.yaml", b"steps: [{id: a, tool: noop, args: {x: !!set {a, b}}}]", "set"),
    ("datekey.yaml", b"steps: [{id: a, tool: noop, args: {2001-01-01: x}}]", ""),
    ("intkey.yaml", b"steps: [{id: a, tool: noop, args: {x: {1: x}}}]", "key"),
    ("binary.yaml", b"steps: [{id: a, tool: noop, args: {x: !!binary aGVsbG8=}}]", "binary"),
    ("nul.json", b'{"steps": []}\x00', ""),
    ("bom.json", b'\xef\xbb\xbf{"steps": []}', ""),
    ("huge.json", b'{"steps": [], "name": "' + b"x" * (16 * 1024 * 1024 + 1) + b'"}', "larger than"),
]


def _load_and_validate(path: Path) -> None:
    validate_plan(load_plan_file(path), builtin_tools(), {})


@pytest.mark.parametrize(("name", "content", "expected"), NASTY, ids=[n for n, _, _ in NASTY])
def test_nasty_plan_files_give_a_plan_error(tmp_path: Path, name: str, content: bytes, expected: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    try:
        _load_and_validate(path)
    except PlanError as exc:
        message = str(exc)
        assert str(path) in message
        assert expected in message
    else:
        assert name in {"date.yaml", "datekey.yaml", "bom.json"}, f"{name} was accepted"


def test_a_date_is_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "date.yaml"
    path.write_bytes(b"steps: [{id: a, tool: noop, args: {when: 2001-02-30, on: {2001-01-01: x}}}]")
    assert load_plan_file(path).steps[0].args == {"when": "2001-02-30", "on": {"2001-01-01": "x"}}


def test_yaml_aliases_within_limits_are_expanded(tmp_path: Path) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text("common: &c {url: 'https://x.test'}\nsteps: [{id: a, tool: noop, args: *c}]\n")
    with pytest.raises(PlanInvalid, match="common: unknown key"):
        load_plan_file(path)
    path.write_text("steps: [{id: a, tool: noop, args: &c {u: 1}}, {id: b, tool: noop, args: *c}]\n")
    assert [s.args for s in load_plan_file(path).steps] == [{"u": 1}, {"u": 1}]


def test_syntax_errors_name_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("steps:\n  - id: a\n    tool: [noop\n")
    with pytest.raises(PlanInvalid, match=r"line \d+, column \d+"):
        load_plan_file(path)


# -- fuzzing -------------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
STEP_KEYS = ["id", "tool", "args", "after", "retries", "timeout", "heartbeat", "estimate", "resources", "reads",
             "writes", "fallback", "approval", "isolation", "verifies", "idempotent"]
PLAN_KEYS = ["steps", "defaults", "on_failure", "capacities", "concurrency", "name"]


@st.composite
def mutated_plans(draw: st.DrawFn) -> bytes:
    """A valid plan with random keys replaced by random values, serialised as JSON or YAML (maybe corrupted)."""
    doc: dict[str, Any] = {"steps": [{"id": "a", "tool": "noop"}, {"id": "b", "tool": "sleep", "args": {"seconds": 0},
                                                          "after": ["a"]}]}
    for _ in range(draw(st.integers(0, 4))):
        step = draw(st.sampled_from(doc["steps"]))
        step[draw(st.sampled_from(STEP_KEYS))] = draw(json_values)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(PLAN_KEYS))] = draw(json_values)
    text = json.dumps(doc).encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.binary(max_size=4)) + text[at + 1:]
    return text


nested = st.integers(1, 1500).map(lambda n: b'{"steps": [{"id": "a", "tool": "noop", "args": {"x": '
                                  + b"[" * n + b"]" * n + b"}}]}")
inputs = st.binary(max_size=200) | mutated_plans() | nested | st.text(max_size=100).map(
    lambda t: t.encode("utf-8", "surrogatepass"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=inputs, suffix=st.sampled_from([".json", ".yaml"]))
def test_fuzzed_plan_files_give_a_plan_or_a_plan_error(tmp_path: Path, content: bytes, suffix: str) -> None:
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(content)
    try:
        _load_and_validate(path)
    except PlanError:
        pass


def test_the_cli_refuses_nasty_plan_files_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    chosen = {"latin1.yaml", "deep.json", "laughs.yaml"}  # each start of the CLI costs about a second
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    running = []
    for name, content, expected in NASTY:
        if name in chosen:
            path = tmp_path / name
            path.write_bytes(content)
            command = [sys.executable, "-m", "planweave.cli.main", "run", str(path), "--json", "--journal", journal]
            running.append((name, expected, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                             env=env, cwd=tmp_path)))
    for name, expected, process in running:
        out, err = process.communicate(timeout=60)
        text = (out + err).decode("utf-8", "replace")
        assert (name, process.returncode) == (name, 2), text
        assert "Traceback" not in text
        assert f"{name} is not valid" in text and expected in text
    assert not (tmp_path / "journal.db").exists()  # nothing ran, nothing was journaled


def test_yaml_on_is_a_key_and_yes_is_text(tmp_path: Path) -> None:
    path = tmp_path / "on.yaml"
    path.write_text("steps:\n  - {id: a, tool: noop, args: {answer: yes, ok: true},\n"
                    "     retries: {max: 1, on: [timeout]}}\n")
    step = load_plan_file(path).steps[0]
    assert step.retries.on == ("timeout",)
    assert step.args == {"answer": "yes", "ok": True}


YAML_CORNERS = """\
name: corners
goal: "quoted: text with ${dollar} and unicode \\u00e9"
defaults: {timeout: 1.5e3}
steps:
  - id: a
    tool: noop
    args:
      on: yes
      off: no
      flag: True
      date: 2001-02-03
      stamp: 2001-12-14t21:59:43.10-05:00
      octal: 0o17
      big: 123456789012345678901234567890
      base: &base {x: [1, 2.5, null, ~, "", '']}
      copy: *base
      merged: {<<: *base, y: 1}
      text: |
        two
        lines
      folded: >
        one
        line
  - {id: b, tool: sleep, after: [a], args: {seconds: 0}}
"""


@pytest.mark.parametrize("text", [VALID_YAML, YAML_CORNERS, "[1, [2, [3]]]", "just text", "", "---\na: 1\n"])
def test_libyaml_reads_what_the_pure_python_loader_reads(text: str) -> None:
    import yaml

    from planweave import planfile

    if planfile._CLoader is None:
        pytest.skip("PyYAML without libyaml")
    assert planfile._parse_yaml(text) == yaml.load(text, Loader=planfile._PlanYamlLoader)


def test_a_valid_yaml_file_is_read_by_libyaml_not_the_pure_python_loader(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from planweave import planfile

    if planfile._CLoader is None:
        pytest.skip("PyYAML without libyaml")
    path = tmp_path / "plan.yaml"
    path.write_text(VALID_YAML, encoding="utf-8")

    def refuse(self: object, stream: object) -> None:
        raise AssertionError("read by the pure-Python loader")

    monkeypatch.setattr(planfile._PlanYamlLoader, "__init__", refuse)
    assert [s.id for s in load_plan_file(path).steps] == ["a", "b"]


@pytest.mark.parametrize("text", ["a: b: c\n", "steps: [1, 2\n", "a:\n  - x\n - y\n", "\tsteps: []\n",
                                  "[" * 300 + "]" * 300])
def test_yaml_errors_keep_the_pure_python_loaders_message(tmp_path: Path, text: str) -> None:
    import yaml

    from planweave import planfile

    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlanInvalid) as raised:
        load_plan_file(path)
    with pytest.raises((yaml.YAMLError, RecursionError)) as pure:
        yaml.load(text, Loader=planfile._PlanYamlLoader)
    assert raised.value.problems[0].message == planfile._syntax_problem(pure.value)
