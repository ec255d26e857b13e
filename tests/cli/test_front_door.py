"""The path a newcomer takes first: the README's goal command and the weather example run as written, a module that
builds its toolbox from ``builtin_tools()`` merges with the command's own built-ins (which stay confined), and a
``Toolbox()`` without built-ins says where they come from."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from planweave import Engine, Toolbox, builtin_tools
from planweave.cli.common import Confinement, UsageError, load_tools
from planweave.core.errors import PlanError
from planweave.core.plan.catalog import BUILTIN_TOOL_NAMES
from planweave.journal import MemoryJournal
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines
from tests.cli.test_goal_and_mcp import planweave

REPO = Path(__file__).resolve().parents[2]


def readme_goal_command() -> list[str]:
    """The README's goal command, verbatim (its first ``planweave goal`` block, continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    match = re.search(r"^planweave goal .*?(?<!\\)$", text, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, "the README has no goal command"
    return shlex.split(match.group(0).replace("\\\n", " "))


def weather_planner(req: RecordedRequest) -> Reply:
    last = str(req.messages[-1]["content"])
    if "If the results answer the goal" in last:
        return Text(json.dumps({"answer": "Go to the warmer, drier city."}))
    return Text(plan_lines([
        {"id": "paris", "tool": "forecast", "args": {"city": "Paris"}},
        {"id": "rome", "tool": "forecast", "args": {"city": "Rome"}},
        {"id": "pick", "tool": "compare", "args": {"a": "${paris}", "b": "${rome}"}},
    ]))


async def test_the_readme_goal_command_runs_as_written(tmp_path: Path) -> None:
    argv = readme_goal_command()
    assert argv[:2] == ["planweave", "goal"] and "--tools" in argv and "examples.weather:toolbox" in argv
    async with ScriptedLLM(weather_planner, ttft=0.01, tokens_per_second=2000) as base_url:
        code, out, err = await planweave(
            *argv[1:], cwd=REPO,
            env={"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-test",
                 "PLANWEAVE_JOURNAL": f"sqlite:///{tmp_path / 'runs.db'}"},
        )
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "succeeded"
    assert set(report["outputs"]) >= {"paris", "rome", "pick"}
    assert report["outputs"]["pick"]["recommend"] in {"Paris", "Rome"}


async def test_the_weather_example_runs_as_its_header_says(tmp_path: Path) -> None:
    header = (REPO / "examples" / "weather.yaml").read_text().splitlines()[1]
    argv = shlex.split(header.lstrip("# "))
    assert argv[:2] == ["planweave", "run"]
    code, out, err = await planweave(*argv[1:], "--json", cwd=REPO,
                                     env={"PLANWEAVE_JOURNAL": f"sqlite:///{tmp_path / 'runs.db'}"})
    assert code == 0, err
    assert json.loads(out)["outputs"]["pick"]["recommend"] in {"Paris", "Rome"}


def test_a_module_built_on_builtin_tools_merges_and_the_shell_stays_confined(tmp_path: Path) -> None:
    box = load_tools(["examples.weather:toolbox"], Confinement(tmp_path, ("echo",)))
    assert {"forecast", "compare", "http.get", "shell", "noop"} <= set(box)
    # the command's confined shell stands, not the module's unconfined one
    assert box["shell"] is not builtin_tools()["shell"]
    assert "Only these programs may run: echo" in box["shell"].description


async def test_the_confined_shell_refuses_what_the_allowlist_does_not_name_with_a_module_toolbox(
        tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps:\n  - {id: env, tool: shell, args: {argv: [printenv]}}\n")
    code, out, _ = await planweave("run", str(plan), "--tools", "examples.weather:toolbox", "--allow-exec", "echo",
                                   "--journal", "memory://", "--json", cwd=REPO)
    assert code != 0
    report = json.loads(out)
    assert report["status"] == "invalid"
    assert "'printenv' is not on this run's executable allowlist" in report["problems"][0]["message"]


def test_a_module_tool_that_takes_a_builtin_name_is_still_a_clear_error(tmp_path: Path) -> None:
    module = tmp_path / "clash_tools.py"
    module.write_text("from planweave import Toolbox\n"
                      "toolbox = Toolbox()\n"
                      "@toolbox.tool\n"
                      "async def shell(argv: list[str]) -> str:\n"
                      "    return 'mine'\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(UsageError, match=r"tool 'shell' is already registered.*name yours differently"):
            load_tools(["clash_tools:toolbox"])
    finally:
        sys.path.remove(str(tmp_path))


async def test_a_toolbox_without_builtins_says_where_they_come_from() -> None:
    async with Engine(MemoryJournal(), tools=Toolbox()) as engine:
        with pytest.raises(PlanError, match=r"'noop' is a built-in tool.*builtin_tools\(\)"):
            await engine.start({"steps": [{"id": "a", "tool": "noop"}]})


def test_the_builtin_names_hint_lists_the_builtins() -> None:
    assert set(BUILTIN_TOOL_NAMES) == set(builtin_tools())
