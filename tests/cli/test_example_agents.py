"""The example agents (examples/research_agent.py, examples/coding_agent.py) run offline as their headers say: the
``planweave run`` command is read from the header of each offline script, run as a real process from the repository's
root, approved with ``planweave approve`` from another process, and checked for what it claims to do (the summary
written through the MCP server, the failing test repaired)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planweave.cli.inspect_cmd import read_run
from tests.cli.test_cli import cli_command, journal_view, sqlite_url, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
OFFLINE = REPO / "examples" / "offline"
NPX_FILESYSTEM = "npx -y @modelcontextprotocol/server-filesystem"
WAIT_S = 240  # for a step to reach a state, and for a run to end: generous, a loaded 2-core machine is slow


def run_commands(lines: list[str]) -> list[list[str]]:
    """The ``planweave goal`` commands in ``lines`` (stripped), each as argv: continuation lines joined."""
    commands: list[list[str]] = []
    for start, line in enumerate(lines):
        if not line.startswith("planweave goal "):
            continue
        command = ""
        for part in lines[start:]:
            command += part.removesuffix("\\") + " "
            if not part.endswith("\\"):
                break
        commands.append(shlex.split(command))
    return commands


def header_command(script: Path) -> list[str]:
    """The ``planweave goal`` command of ``script``'s header comment."""
    text = script.read_text(encoding="utf-8")
    return run_commands([line[1:].strip() for line in text.splitlines() if line.startswith("#")])[0]


def as_run_here(argv: list[str], replace: dict[str, str], journal: str) -> list[str]:
    """``argv`` (``planweave goal ...``) run by this interpreter, each ``replace`` key substituted in every argument,
    on ``journal``, printing one JSON report."""
    args = argv[1:]
    for old, new in replace.items():
        args = [a.replace(old, new) for a in args]
    return [*cli_command(*args), "--journal", journal, "--json"]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def filesystem_server() -> str:
    """The MCP filesystem server scripts/install-mcp-servers.sh installed (the header's ``npx`` would download it)."""
    cache = Path(os.environ.get("PLANWEAVE_MCP_CACHE", REPO / ".cache" / "mcp"))
    path = cache / "node_modules" / ".bin" / "mcp-server-filesystem"
    if not path.exists():
        pytest.fail(f"mcp-server-filesystem is not installed in {cache}: run scripts/install-mcp-servers.sh",
                    pytrace=False)
    return str(path)


def env_with_pytest() -> dict[str, str]:
    """The CLI's environment with this interpreter's scripts (``pytest``) first on ``PATH``, as in an active venv."""
    env = subprocess_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    assert shutil.which("pytest", path=env["PATH"]), "pytest is not installed next to this interpreter"
    return env


def wait_for_step(url: str, run_id: str, step: str, status: str, proc: subprocess.Popen[str]) -> None:
    """Poll the journal until ``step`` has ``status``; fail if the run ended first or the deadline passed."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        seen = journal_view(url, run_id)
        record = seen.state.records.get(step) if seen is not None and seen.state is not None else None
        if record is not None and record.status == status:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended with {proc.returncode} before step '{step}' was {status}: {err}\n{out}")
        time.sleep(0.2)
    pytest.fail(f"step '{step}' was not {status} within {WAIT_S} s")


def run_with_approval(command: list[str], url: str, step: str, env: dict[str, str],
                      while_waiting: Callable[[], None], *, approve: bool = True) -> tuple[int, dict[str, Any]]:
    """Start ``command``, wait until ``step`` waits for approval, call ``while_waiting``, then answer with
    ``planweave approve`` from another process; return the run's exit code and JSON report."""
    run_id = option(command, "--run-id")
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_step(url, run_id, step, "waiting_approval", proc)
        while_waiting()
        answer = ["approve", run_id, step, "--journal", url]
        if not approve:
            answer += ["--reject", "--reason", "not this patch"]
        given = subprocess.run(cli_command(*answer), cwd=REPO, capture_output=True, text=True, env=env,
                               timeout=WAIT_S)
        assert given.returncode == 0, given.stderr
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.strip(), err
    report: dict[str, Any] = json.loads(out)
    return proc.returncode, report


@pytest.mark.parametrize(("module", "script"), [("research_agent.py", "research-agent.yaml"),
                                                ("coding_agent.py", "coding-agent.yaml")])
def test_an_agent_module_gives_its_scripts_offline_command_and_the_same_with_a_model(module: str, script: str) -> None:
    docstring = (REPO / "examples" / module).read_text(encoding="utf-8").split('"""')[1]
    offline, with_key = run_commands([line.strip() for line in docstring.splitlines()])
    assert offline == header_command(OFFLINE / script)
    assert option(offline, "--model") == f"scripted:examples/offline/{script}"
    assert option(with_key, "--model") == "gpt-4o-mini"

    def rest(argv: list[str]) -> list[str]:  # all but the values of the goal, the model and the run id
        drop = {2, *(argv.index(name) + 1 for name in ("--model", "--run-id"))}  # 2: the goal's text
        return [a for i, a in enumerate(argv) if i not in drop]

    assert rest(with_key) == rest(offline)


# -- the research agent ---------------------------------------------------------------------------------------------
def test_the_research_agent_reads_notes_over_mcp_fetches_a_page_and_writes_a_summary_once_approved(
        tmp_path: Path) -> None:
    notes = tmp_path / "research-notes"
    shutil.copytree(REPO / "examples" / "research-notes", notes)  # the header's `cp -r`
    originals = {p.name: p.read_text(encoding="utf-8") for p in notes.glob("*.md")}
    url = sqlite_url(tmp_path)
    command = as_run_here(header_command(OFFLINE / "research-agent.yaml"),
                          {NPX_FILESYSTEM: shlex.quote(filesystem_server()), "/tmp/research-notes": str(notes)}, url)
    summary = notes / "summary.md"
    seen_before_approval: list[bool] = []

    code, report = run_with_approval(command, url, "write", subprocess_env(),
                                     lambda: seen_before_approval.append(summary.exists()))

    assert code == 0 and report["status"] == "succeeded", report.get("error")
    assert seen_before_approval == [False]  # nothing written while the write waited for the person
    # the listing (an observation) re-planned: the notes it named were read through the MCP server
    assert [v["trigger"] for v in report["plan_versions"]] == ["initial", "observation"]
    outputs = report["outputs"]
    assert all(name in outputs["listing"]["content"] for name in originals)
    assert outputs["journals"]["content"] == originals["journals.md"]
    assert outputs["side_effects"]["content"] == originals["side-effects.md"]
    # the page came over HTTP from the example's own server on 127.0.0.1
    assert outputs["page"]["status"] == 200 and outputs["site"]["url"].startswith("http://127.0.0.1:")
    assert outputs["page_text"]["title"] == "Idempotency keys: making retries safe"
    # the summary was written through the MCP server's write_file, into the notes folder it was given
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("# Durable execution: a summary of my notes")
    assert outputs["summarise"]["text"] in text
    assert '"Idempotency keys: making retries safe"' in text and outputs["site"]["url"] in text
    assert not (REPO / "examples" / "research-notes" / "summary.md").exists()


# -- the coding agent -----------------------------------------------------------------------------------------------
def coding_agent_command(tmp_path: Path) -> tuple[list[str], Path, str]:
    project = tmp_path / "stats-project"
    shutil.copytree(REPO / "examples" / "coding-agent" / "project", project,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))  # the header's `cp -r`
    url = sqlite_url(tmp_path)
    command = as_run_here(header_command(OFFLINE / "coding-agent.yaml"), {"/tmp/stats-project": str(project)}, url)
    assert option(command, "--workdir") == str(project) and option(command, "--allow-exec") == "pytest"
    return command, project, url


def project_tests(project: Path) -> subprocess.CompletedProcess[str]:
    """The project's tests, run by this test itself (not by the agent)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project,
                          capture_output=True, text=True, timeout=WAIT_S,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


def test_the_coding_agent_sees_a_failing_test_proposes_a_patch_and_repairs_it_once_approved(
        tmp_path: Path) -> None:
    command, project, url = coding_agent_command(tmp_path)
    buggy = (project / "stats.py").read_text(encoding="utf-8")
    unchanged_while_waiting: list[bool] = []

    code, report = run_with_approval(
        command, url, "fix", env_with_pytest(),
        lambda: unchanged_while_waiting.append((project / "stats.py").read_text(encoding="utf-8") == buggy))

    assert code == 0 and report["status"] == "succeeded", report.get("error")
    assert unchanged_while_waiting == [True]  # the patch was proposed, not written, before the approval
    outputs = report["outputs"]
    # the first run failed (one of four tests), and its result re-planned: the patch came after it
    assert outputs["tests"]["exit_code"] == 1 and "1 failed, 3 passed" in outputs["tests"]["stdout"]
    assert [v["trigger"] for v in report["plan_versions"]] == ["initial", "observation"]
    assert "-    return ordered[middle]" in outputs["patch"]["diff"]
    # the fix is in the file, and the second run passed
    fixed = (project / "stats.py").read_text(encoding="utf-8")
    assert fixed == outputs["patch"]["text"] != buggy
    assert outputs["retest"]["exit_code"] == 0 and "4 passed" in outputs["retest"]["stdout"]
    assert project_tests(project).returncode == 0
    assert (REPO / "examples" / "coding-agent" / "project" / "stats.py").read_text(encoding="utf-8") == buggy


def test_the_coding_agent_writes_nothing_when_the_patch_is_rejected(tmp_path: Path) -> None:
    command, project, url = coding_agent_command(tmp_path)
    buggy = (project / "stats.py").read_text(encoding="utf-8")

    _, report = run_with_approval(command, url, "fix", env_with_pytest(), lambda: None, approve=False)

    # the rejected step failed (kind rejected); the script has no other patch: its repair drops fix and retest
    assert [v["trigger"] for v in report["plan_versions"]] == ["initial", "observation", "local_repair"]
    assert "fix" not in report["steps"] and "retest" not in report["steps"]
    assert (project / "stats.py").read_text(encoding="utf-8") == buggy
    assert project_tests(project).returncode == 1  # still the failing test
    events = asyncio.run(read_run(url, option(command, "--run-id"), outputs=True)).events
    of_fix = [(e.kind, e.data) for e in events if e.step == "fix"]
    assert ("approval_given", {"approve": False, "reason": "not this patch"}) in [
        (kind, {k: data[k] for k in ("approve", "reason") if k in data}) for kind, data in of_fix]
    assert "step_started" not in [kind for kind, _ in of_fix]  # file.write was never called
    assert any(kind == "step_failed" and data["kind"] == "rejected" for kind, data in of_fix)
