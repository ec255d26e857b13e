"""The safety guards: paths stay under their roots, programs come from the allowlist, secrets never show."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, open_engine
from planweave.core.errors import RunError, ToolError
from planweave.core.events import Event
from planweave.journal.memory import MemoryJournal
from planweave.tools.registry import Toolbox
from planweave.tools.safety import (
    ExecutableNotAllowed,
    PathNotAllowed,
    SafetyError,
    SecretRedactor,
    allowlisted_shell,
    check_argv,
    confine_path,
    confined_shell,
    file_tools,
    redact,
    secret_values,
)
from tests.processes import journal_bytes


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "sub" / "a.txt").write_text("inside")
    (tmp_path / "outside.txt").write_text("secret")
    return tmp_path / "root"


# -- confine_path -----------------------------------------------------------------------------------------------------
def test_relative_paths_resolve_under_the_first_root(root: Path) -> None:
    assert confine_path("sub/a.txt", [root]) == (root / "sub" / "a.txt").resolve()
    assert confine_path("sub/../sub/a.txt", [root]) == (root / "sub" / "a.txt").resolve()
    assert confine_path("new/file.txt", [root]) == (root / "new" / "file.txt").resolve()  # need not exist yet


def test_dotdot_that_climbs_out_is_refused_naming_path_and_roots(root: Path) -> None:
    with pytest.raises(PathNotAllowed) as err:
        confine_path("../outside.txt", [root])
    assert str(err.value) == f"path '../outside.txt' climbs out of the allowed roots ({root.resolve()})"
    assert (err.value.kind, err.value.retryable) == ("forbidden", False)


def test_absolute_paths_must_lie_under_a_root(root: Path, tmp_path: Path) -> None:
    assert confine_path(root / "sub" / "a.txt", [root]) == (root / "sub" / "a.txt").resolve()
    with pytest.raises(PathNotAllowed, match=r"path '/etc/passwd' is outside the allowed roots"):
        confine_path("/etc/passwd", [root])
    with pytest.raises(PathNotAllowed, match="is outside"):
        confine_path(tmp_path / "outside.txt", [root])


def test_a_symlink_out_of_the_roots_is_refused(root: Path, tmp_path: Path) -> None:
    (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    (root / "linkdir").symlink_to(tmp_path)
    with pytest.raises(PathNotAllowed, match=r"path 'link.txt' leads outside the allowed roots .* through a symlink"):
        confine_path("link.txt", [root])
    with pytest.raises(PathNotAllowed, match="through a symlink"):
        confine_path("linkdir/outside.txt", [root])


def test_a_symlink_between_two_roots_is_allowed(root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.txt").write_text("b")
    (root / "to-other").symlink_to(other)
    assert confine_path("to-other/b.txt", [root, other]) == (other / "b.txt").resolve()


def test_no_roots_allow_nothing(root: Path) -> None:
    with pytest.raises(PathNotAllowed, match="no root directories are allowed"):
        confine_path("a.txt", [])


# -- the executable allowlist ----------------------------------------------------------------------------------------
def test_a_program_on_the_allowlist_runs_and_others_are_refused() -> None:
    assert check_argv(["git", "status"], {"git", "make"}) == ["git", "status"]
    with pytest.raises(ExecutableNotAllowed) as err:
        check_argv(["curl", "http://example.com"], {"git", "make"})
    assert str(err.value) == "program 'curl' is not on this run's executable allowlist (git, make)"
    with pytest.raises(ExecutableNotAllowed, match="argv is empty"):
        check_argv([], {"git"})


def test_a_bare_name_does_not_allow_another_file_of_that_name(tmp_path: Path) -> None:
    with pytest.raises(ExecutableNotAllowed):
        check_argv(["./sh"], {"sh"})
    with pytest.raises(ExecutableNotAllowed):
        check_argv([str(tmp_path / "sh")], {"sh"})
    found = shutil.which("sh")
    assert found is not None
    assert check_argv([found, "-c", "true"], {"sh"})[0] == found  # the file the name means


def test_an_absolute_path_entry_allows_exactly_that_file() -> None:
    assert check_argv([sys.executable, "-V"], {sys.executable})
    with pytest.raises(ExecutableNotAllowed):
        check_argv(["python3"], {sys.executable})


async def test_the_allowlisted_shell_refuses_at_validation_and_at_call_time() -> None:
    shell = allowlisted_shell([sys.executable])
    assert shell.name == "shell"
    assert shell.check_args({"argv": ["rm", "-rf", "/"]}, frozenset()) == [
        ("argv[0]", f"program 'rm' is not on this run's executable allowlist ({sys.executable})"),
    ]
    assert shell.check_args({"argv": "${plan.argv}"}, frozenset({"argv"})) == []
    result = await shell.invoke({"argv": [sys.executable, "-c", "print(6 * 7)"]})
    assert result["stdout"] == "42\n"
    with pytest.raises(SafetyError) as err:
        await shell.invoke({"argv": ["rm", "-rf", "/nonexistent-planweave"]})
    assert err.value.kind == "forbidden"


# -- redaction -------------------------------------------------------------------------------------------------------
ENV = {
    "OPENAI_API_KEY": "sk-test-1234567890",
    "GITHUB_TOKEN": "ghp_abcdefghij",
    "DB_PASSWORD": "hunter2!",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    "SHORT_KEY": "abc12",
    "HOME": "/home/planweave",
    "PATH": "/usr/bin:/bin",
}


def test_secret_values_are_the_secret_looking_names_of_six_characters_or_more() -> None:
    assert set(secret_values(ENV)) == {"sk-test-1234567890", "ghp_abcdefghij", "hunter2!", "wJalrXUtnFEMI"}


def test_redact_replaces_secrets_in_text_and_nested_outputs() -> None:
    text = "curl -H 'Authorization: Bearer ghp_abcdefghij' -u admin:hunter2! in /home/planweave"
    assert redact(text, ENV) == "curl -H 'Authorization: Bearer ***' -u admin:*** in /home/planweave"
    output = {"stdout": ["key=sk-test-1234567890"], "meta": ("wJalrXUtnFEMI", 3), "exit_code": 0, "short": "abc12"}
    assert redact(output, ENV) == {"stdout": ["key=***"], "meta": ("***", 3), "exit_code": 0, "short": "abc12"}


def test_redact_takes_a_list_of_values_or_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert redact("a token: tok-999999 and tok-9", ["tok-999999", "tok-9"]) == "a token: *** and tok-9"
    monkeypatch.setenv("PLANWEAVE_TEST_API_KEY", "pw-secret-value")
    assert redact("echo pw-secret-value") == "echo ***"
    assert "pw-secret-value" in secret_values(os.environ)


def test_a_longer_secret_is_replaced_whole_when_it_contains_a_shorter_one() -> None:
    assert redact("abcdef-ghijkl", ["abcdef", "abcdef-ghijkl"]) == "***"


# -- file tools ------------------------------------------------------------------------------------------------------
async def test_file_tools_read_write_and_list_under_the_roots(root: Path) -> None:
    box = file_tools([root])
    assert set(box) == {"file.read", "file.write", "file.list"}
    assert box["file.read"].idempotent and not box["file.write"].idempotent
    written = await box["file.write"].invoke({"path": "out/report.md", "text": "# done\n"})
    assert written == {"path": str((root / "out" / "report.md").resolve()), "bytes": 7}
    await box["file.write"].invoke({"path": "out/report.md", "text": "more\n", "append": True})
    read = await box["file.read"].invoke({"path": "out/report.md"})
    assert (read["text"], read["size"], read["truncated"]) == ("# done\nmore\n", 12, False)
    listing = await box["file.list"].invoke({"path": ".", "recursive": True})
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [
        ("out", "dir"), ("out/report.md", "file"), ("sub", "dir"), ("sub/a.txt", "file"),
    ]
    only_md = await box["file.list"].invoke({"pattern": "*.md", "recursive": True})
    assert [e["name"] for e in only_md["entries"]] == ["out/report.md"]


async def test_file_tools_refuse_escapes(root: Path, tmp_path: Path) -> None:
    box = file_tools([root])
    (root / "escape").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(PathNotAllowed, match="climbs out"):
        await box["file.read"].invoke({"path": "../outside.txt"})
    with pytest.raises(PathNotAllowed, match="through a symlink"):
        await box["file.read"].invoke({"path": "escape"})
    with pytest.raises(PathNotAllowed, match="is outside"):
        await box["file.write"].invoke({"path": str(tmp_path / "planted.txt"), "text": "x"})
    with pytest.raises(PathNotAllowed, match="through a symlink"):
        await box["file.write"].invoke({"path": "escape", "text": "overwritten"})
    assert (tmp_path / "outside.txt").read_text() == "secret"
    assert not (tmp_path / "planted.txt").exists()


async def test_file_tools_cap_their_output(root: Path) -> None:
    box = file_tools([root], read_limit=10, write_limit=20, list_limit=1)
    (root / "big.txt").write_text("x" * 25)
    read = await box["file.read"].invoke({"path": "big.txt"})
    assert read["truncated"] and read["size"] == 25
    assert read["text"].startswith("x" * 10 + "\n[... 15 more bytes cut")
    with pytest.raises(ToolError, match=r"21 characters for 'w\.txt' exceed the limit of 20"):
        await box["file.write"].invoke({"path": "w.txt", "text": "y" * 21})
    listing = await box["file.list"].invoke({})
    assert len(listing["entries"]) == 1 and listing["truncated"]


def test_file_tools_need_existing_root_directories(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        file_tools([tmp_path / "missing"])


# -- one resolution, checked and executed; env and options that run other programs (issue 8, #2-#4) --------------
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="needs git on PATH")


def fake_program(directory: Path, name: str, marker: Path) -> Path:
    """An executable ``name`` in ``directory`` that leaves ``marker`` behind when it runs: the exploit's payload."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / name
    script.write_text(f"#!/bin/sh\necho ran > '{marker}'\necho fake\n")
    script.chmod(0o755)
    return script


@needs_git
async def test_a_path_in_the_step_env_is_refused_at_validation_and_at_call_time(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    fake_program(tmp_path / "evil", "git", marker)
    tool = confined_shell(allowlist=["git"], workdir=tmp_path)
    args = {"argv": ["git", "--version"], "env": {"PATH": str(tmp_path / "evil")}}
    problems = tool.check_args(args, frozenset())
    assert [field for field, _ in problems] == ["env.PATH"]
    assert "env key 'PATH' refused: it changes which program a name runs (rule PATH" in problems[0][1]
    assert 'allow_env = ["PATH"] in a --config' in problems[0][1]
    with pytest.raises(SafetyError, match=r"env key 'PATH' refused") as err:
        await tool.invoke(args)
    assert err.value.kind == "forbidden"
    assert not marker.exists()


@needs_git
async def test_an_allowed_path_env_does_not_change_which_program_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    fake_program(tmp_path / "evil", "git", marker)
    tool = confined_shell(allowlist=["git"], workdir=tmp_path, allow_env=["PATH"])
    result = await tool.invoke({"argv": ["git", "--version"], "env": {"PATH": str(tmp_path / "evil")}})
    assert result["stdout"].startswith("git version")  # the git the engine's own PATH finds
    assert not marker.exists()


async def test_a_relative_program_is_resolved_from_the_steps_cwd_then_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    legit, planted = tmp_path / "legit-ran", tmp_path / "planted-ran"
    allowed = fake_program(tmp_path / "bin", "build", legit)
    fake_program(tmp_path / "jail" / "sub" / "bin", "build", planted)  # e.g. written by file.write
    monkeypatch.chdir(tmp_path)  # where "bin/build" is the allowed file
    tool = confined_shell(allowlist=[str(allowed)], workdir=tmp_path / "jail")
    with pytest.raises(ExecutableNotAllowed, match=r"program 'bin/build' \(resolved to .*/jail/sub/bin/build\)"):
        await tool.invoke({"argv": ["bin/build"], "cwd": "sub"})
    assert not planted.exists()
    result = await tool.invoke({"argv": ["../../bin/build"], "cwd": "sub"})  # the allowed file itself
    assert result["stdout"] == "fake\n" and legit.exists() and not planted.exists()


def test_a_symlink_to_an_allowed_program_under_another_name_is_refused(tmp_path: Path) -> None:
    found = shutil.which("sh")
    assert found is not None
    (tmp_path / "ls").symlink_to(found)
    with pytest.raises(ExecutableNotAllowed):
        check_argv([str(tmp_path / "ls")], {"sh"})
    with pytest.raises(ExecutableNotAllowed):
        check_argv(["./ls"], {"sh"}, cwd=tmp_path)


@pytest.mark.parametrize("key", [
    "PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "GIT_SSH_COMMAND", "GIT_CONFIG_COUNT",
    "PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV", "ENV", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "IFS", "HOME",
    "XDG_CONFIG_HOME", "GCONV_PATH", "path",
])
def test_env_keys_that_change_what_a_program_executes_are_refused(key: str, tmp_path: Path) -> None:
    tool = confined_shell(allowlist=["sh"], workdir=tmp_path)
    problems = tool.check_args({"argv": ["sh", "-c", "true"], "env": {key: "x", "LANG": "C"}}, frozenset())
    assert [field for field, _ in problems] == [f"env.{key}"]
    assert f"env key '{key}' refused" in problems[0][1]
    allowed = confined_shell(allowlist=["sh"], workdir=tmp_path, allow_env=[key])
    assert allowed.check_args({"argv": ["sh", "-c", "true"], "env": {key: "x"}}, frozenset()) == []


@needs_git
async def test_git_config_variables_in_env_cannot_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tool = confined_shell(allowlist=["git"], workdir=tmp_path)
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "alias.x", "GIT_CONFIG_VALUE_0": f"!touch {marker}"}
    with pytest.raises(SafetyError, match=r"env key 'GIT_CONFIG_COUNT' refused: .* \(rule GIT_\*"):
        await tool.invoke({"argv": ["git", "x"], "env": env, "check": False})
    assert not marker.exists()


@needs_git
@pytest.mark.parametrize("argv", [
    ["git", "-c", "alias.x=!touch {marker}", "x"],
    ["git", "-calias.x=!touch {marker}", "x"],
    ["git", "--config-env=alias.x=EVIL", "x"],
    ["git", "--exec-path={dir}", "x"],
    ["git", "-C", "/", "status"],
    ["git", "clone", "--upload-pack=touch {marker}", "file:///nonexistent", "c"],
    ["git", "clone", "-u", "touch {marker}", "file:///nonexistent", "c"],
    ["git", "clone", "-c", "core.sshCommand=touch {marker}", "ssh://h/r", "c"],
    ["git", "push", "--receive-pack=touch {marker}", "origin"],
])
async def test_git_options_that_run_other_programs_are_refused(argv: list[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [a.format(marker=marker, dir=tmp_path) for a in argv]
    tool = confined_shell(allowlist=["git"], workdir=tmp_path)
    problems = tool.check_args({"argv": argv}, frozenset())
    assert len(problems) == 1 and problems[0][0].startswith("argv[")
    assert "refused for git: it runs other programs or leaves the working directory" in problems[0][1]
    with pytest.raises(SafetyError, match="refused for git"):
        await tool.invoke({"argv": argv, "check": False})
    assert not marker.exists()


@needs_git
async def test_ordinary_git_commands_still_run(tmp_path: Path) -> None:
    tool = confined_shell(allowlist=["git"], workdir=tmp_path)
    env = {"LANG": "C"}
    assert tool.check_args({"argv": ["git", "init", "-q", "."], "env": env}, frozenset()) == []
    await tool.invoke({"argv": ["git", "init", "-q", "."], "env": env})
    status = await tool.invoke({"argv": ["git", "status", "--short"], "check": True})
    assert status["exit_code"] == 0
    assert tool.check_args({"argv": ["git", "grep", "-c", "x"]}, frozenset()) == []  # -c after grep: count


# -- secrets written in a plan: journaled as placeholders, run with the real value (issue 8, #5) ----------------
PLAN_SECRET = "sk-plan-literal-123456"


def secret_plan() -> dict[str, Any]:
    return {"name": "deploy", "steps": [
        {"id": "call", "tool": "grab", "args": {"headers": {"Authorization": f"Bearer {PLAN_SECRET}"}, "n": 1},
         "description": f"uses {PLAN_SECRET}"},
        {"id": "later", "tool": "grab", "args": {"headers": {"x": "${call.seen}"}, "n": 2}},
    ]}


def grab_tools(seen: list[Any]) -> Toolbox:
    box = Toolbox()

    async def grab(headers: dict[str, str], n: int) -> dict[str, Any]:
        seen.append(headers)  # recorded, asserted after the run
        return {"seen": headers.get("Authorization", "")}

    box.add(grab, name="grab")
    return box


async def test_a_secret_in_a_plan_is_journaled_as_a_placeholder_while_the_step_gets_the_value() -> None:
    seen: list[Any] = []
    secrets = SecretRedactor({"OPENAI_API_KEY": PLAN_SECRET, "HOME": "/home/x"})
    journal = MemoryJournal()
    async with Engine(journal, tools=grab_tools(seen), redact=secrets) as engine:
        run = await engine.start(secret_plan())
        result = await run.wait()
        extra = await engine.start({"steps": []}, hold=True)
        extra.extend([{"id": "added", "tool": "grab", "args": {"headers": {"k": PLAN_SECRET}, "n": 3}}])
        extra.propose({"steps": [{"id": "added", "tool": "grab", "args": {"headers": {"k": PLAN_SECRET}, "n": 3}},
                                 {"id": "more", "tool": "grab", "args": {"headers": {"k": PLAN_SECRET}, "n": 4}}]})
        extra.release()
        await extra.wait()
    assert result.ok
    assert seen[0] == {"Authorization": f"Bearer {PLAN_SECRET}"}  # the real value, in this process
    assert {"k": PLAN_SECRET} in seen
    events = await journal.read(None)
    stored = json.dumps([e.data for e in events], default=lambda v: v.model_dump(mode="json"))
    assert PLAN_SECRET not in stored
    assert re.search(r"Bearer \*\*\*\$OPENAI_API_KEY#[0-9a-f]{16}\*\*\*", stored)
    assert re.search(r"uses \*\*\*\$OPENAI_API_KEY#[0-9a-f]{16}\*\*\*", stored)
    assert {e.kind for e in events} >= {"run_created", "steps_added", "plan_version"}


def test_unseal_restores_the_value_from_this_environment_or_names_the_missing_variable() -> None:
    sealer = SecretRedactor({"OPENAI_API_KEY": PLAN_SECRET})
    event = Event("r1", "run_created", 0.0, None, {"plan": {"steps": [
        {"id": "a", "tool": "noop", "args": {"k": f"x {PLAN_SECRET} y"}}]}})
    sealed = sealer.seal(event)
    nonce = sealed.data["seal"]
    assert sealed.data["plan"]["steps"][0]["args"] == {"k": f"x ***$OPENAI_API_KEY#{nonce}*** y"}
    assert SecretRedactor({"OPENAI_API_KEY": PLAN_SECRET}).unseal([sealed])[0].data == event.data
    with pytest.raises(RunError) as err:
        SecretRedactor({"OTHER_TOKEN": "zzzzzzzz"}).unseal([sealed])
    assert str(err.value) == (
        "run 'r1': its plan held the value of $OPENAI_API_KEY, which the journal keeps sealed: "
        "set OPENAI_API_KEY in this environment to resume it")
    quoted = 'pa"ss\\word\né-1'  # characters JSON escapes
    odd = Event("r1", "run_created", 0.0, None,
                {"plan": {"steps": [{"id": "a", "tool": "noop", "args": {"k": quoted}}]}})
    odd_sealed = SecretRedactor({"DB_PASSWORD": quoted}).seal(odd)
    assert odd_sealed.data["plan"]["steps"][0]["args"] == {"k": f"***$DB_PASSWORD#{odd_sealed.data['seal']}***"}
    plain = Event("r1", "run_created", 0.0, None, {"plan": {"steps": [{"id": "a", "tool": "noop"}]}})
    assert sealer.seal(plain) is plain  # nothing secret: the event is journaled as it is


async def test_a_resumed_run_gets_the_secret_from_the_environment_of_the_resuming_process(tmp_path: Path) -> None:
    seen: list[Any] = []
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"steps": [{"id": "gate", "tool": "gate", "args": {}},
                      {"id": "call", "tool": "grab", "args": {"headers": {"Authorization": PLAN_SECRET}, "n": 1},
                       "after": ["gate"]}]}
    started = asyncio.Event()
    tools = grab_tools(seen)

    first_process = [True]

    async def gate() -> bool:
        started.set()
        if first_process[0]:
            await asyncio.Event().wait()  # the first process dies (its engine closes) while the gate waits
        return True

    tools.add(gate, name="gate", idempotent=True)
    async with open_engine(url, tools=tools, redact=SecretRedactor({"OPENAI_API_KEY": PLAN_SECRET})) as engine:
        run = await engine.start(plan)
        await started.wait()
    assert seen == []
    first_process[0] = False
    async with open_engine(url, tools=tools, redact=SecretRedactor({})) as engine:
        with pytest.raises(RunError, match=r"set OPENAI_API_KEY in this environment to resume it"):
            await engine.resume(run.id)
    async with open_engine(url, tools=tools, redact=SecretRedactor({"OPENAI_API_KEY": PLAN_SECRET})) as engine:
        second = await (await engine.resume(run.id)).wait()
    assert second.ok, second.error
    assert seen == [{"Authorization": PLAN_SECRET}]
    raw = journal_bytes(tmp_path)
    assert PLAN_SECRET.encode() not in raw and b"***$OPENAI_API_KEY#" in raw


