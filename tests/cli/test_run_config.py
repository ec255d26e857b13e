"""The run configuration (``--config FILE`` or ``--config KEY=VALUE``): the rarer knobs of ``run``, ``goal``,
``resume``, ``serve``, ``worker``, ``submit`` and ``mcp``; bad input exits 2 naming the key and where it was written;
and the command line by purpose: no command above 20 options, ``run --goal`` forwarded to ``goal``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import typer.main

from planweave.cli.common import UsageError
from planweave.cli.main import COMMAND_GROUPS, GOAL_ALIAS_NOTE, build_app
from planweave.cli.run_cmd import _resume_mode_flags
from planweave.cli.run_config import COMMAND_KEYS, KEYS, ConfigError, load_config
from tests.cli.test_cli import cli_command, invoke, subprocess_env, write_plan

REPO = Path(__file__).resolve().parents[2]
MOST_OPTIONS = 20
GPU_PLAN = {"capacities": {"gpu": 1},
            "steps": [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": 10}, "resources": {"gpu": 1}}
                      for i in range(4)]}


def option_counts() -> dict[str, int]:
    """Every command of the app (subcommands by their path) and how many options it takes, ``--help`` aside."""
    counts: dict[str, int] = {}

    def walk(command: object, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{path} {name}".strip())
            return
        counts[path] = sum(1 for p in getattr(command, "params", []) if p.param_type_name == "option")

    walk(typer.main.get_command(build_app()), "")
    return counts


def test_no_command_takes_more_than_twenty_options() -> None:
    counts = option_counts()
    assert {"run", "goal", "resume", "serve", "worker", "submit", "mcp"} <= set(counts)
    assert len(counts) >= len({n for names in COMMAND_GROUPS.values() for n in names})
    over = {name: n for name, n in counts.items() if n > MOST_OPTIONS}
    assert over == {}, f"commands above {MOST_OPTIONS} options: {over} (move rare knobs to the run configuration)"


def test_a_config_file_sets_a_knob_and_an_option_on_the_command_line_wins(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "caps.yaml", GPU_PLAN)
    config = tmp_path / "run.toml"
    config.write_text("capacities = {gpu = 4}\n")
    wide = invoke("run", str(plan), "--config", str(config), "--journal", "memory://", "--virtual-clock", "--json")
    assert wide.exit_code == 0, wide.output
    assert json.loads(wide.stdout)["makespan_s"] == pytest.approx(10.0)
    # a later --config wins key by key, and --capacity over both
    pair = invoke("run", str(plan), "--config", str(config), "--config", "capacities={gpu = 2}",
                  "--journal", "memory://", "--virtual-clock", "--json")
    assert json.loads(pair.stdout)["makespan_s"] == pytest.approx(20.0)
    flag = invoke("run", str(plan), "--config", str(config), "--capacity", "gpu=1", "--journal", "memory://",
                  "--virtual-clock", "--json")
    assert json.loads(flag.stdout)["makespan_s"] == pytest.approx(40.0)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("run.toml", "priorty = 1\n", "run.toml: unknown key 'priorty' (did you mean 'priority'?)"),
    ("run.yaml", "cache: 'yes'\n", "run.yaml: key 'cache': Input should be a valid boolean (got 'yes')"),
    ("run.json", '{"capacities": {"gpu": 0}}', "run.json: key 'capacities': Value error, capacity 'gpu' must be"),
    ("run.toml", "draft_model = 'small'\n",
     "run.toml: key 'draft_model' applies to goal runs (planweave goal), not to planweave run"),
    ("run.toml", "request_timeout = 5\n", "run.toml: key 'request_timeout' does not apply to planweave run (it "
                                          "applies to: serve)"),
    ("run.toml", "cache = \n", "run.toml: not valid TOML"),
    ("run.ini", "cache = false\n", "expected a .toml, .yaml, .yml or .json file, or KEY=VALUE"),
])
def test_a_bad_config_file_exits_2_naming_the_key_and_the_file(tmp_path: Path, name: str, text: str,
                                                               message: str) -> None:
    plan = write_plan(tmp_path / "plan.yaml", {"steps": [{"id": "a", "tool": "noop"}]})
    config = tmp_path / name
    config.write_text(text)
    done = invoke("run", str(plan), "--config", str(config), "--journal", "memory://", "--json")
    assert done.exit_code == 2, done.output
    error = json.loads(done.stdout)["error"]
    assert message in error, error
    assert str(config) in error or name == "run.ini"


def test_a_pair_is_read_as_toml_else_as_text_and_names_itself_in_errors(tmp_path: Path) -> None:
    loaded = load_config(["priority=2", "cache=false", 'allow_env=["PATH"]', "prices=p.yaml"], "run")
    assert (loaded.values.priority, loaded.values.cache, loaded.values.allow_env) == (2.0, False, ["PATH"])
    assert loaded.values.prices == "p.yaml"  # not TOML: the text as given
    assert loaded.where("cache") == "--config cache=false: key 'cache'"
    with pytest.raises(ConfigError, match=r"--config priority=high: key 'priority': Input should be a valid number"):
        load_config(["priority=high"], "run")
    with pytest.raises(ConfigError, match=r"--config speculate=safe: key 'speculate' applies to plan files"):
        load_config(["speculate=safe"], "goal")


def test_resume_takes_its_keys_and_leaves_the_others_to_the_journal() -> None:
    loaded = load_config(["priority=3", "cache=false", 'headers=["X-Org: acme"]'], "resume")
    assert loaded.values.priority is None and loaded.values.cache is False
    # a resume line repeats the config, never a header's value
    assert loaded.resume_args() == ["--config", "priority=3", "--config", "cache=false"]


def test_every_key_is_read_by_some_command_and_documented() -> None:
    read = {key for keys in COMMAND_KEYS.values() for key in keys}
    assert read == set(KEYS)
    docs = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert [key for key in KEYS if f"| `{key}` |" not in docs] == []


def test_an_option_that_moved_to_the_config_says_which_key(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", {"steps": [{"id": "a", "tool": "noop"}]})
    done = invoke("run", str(plan), "--tiers", "tiers.yaml", "--journal", "memory://")
    assert done.exit_code == 2
    said = " ".join(done.output.replace("│", " ").split())
    assert "--tiers is a key of the run configuration for planweave run: give --config tiers=FILE" in said


def test_run_goal_is_forwarded_to_goal_with_a_note(tmp_path: Path) -> None:
    args = ('"Compare tomorrow\'s weather in Paris and Rome and recommend one"', "--tools", "examples.weather:toolbox",
            "--model", "scripted:examples/offline/weather.yaml", "--journal", "memory://", "--json")
    text = args[0].strip('"')
    old = subprocess.run(cli_command("run", "--goal", text, *args[1:]), cwd=REPO, env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert old.returncode == 0, old.stderr
    assert old.stderr.splitlines()[0] == GOAL_ALIAS_NOTE
    report = json.loads(old.stdout)
    assert report["status"] == "succeeded" and report["answer"]
    new = subprocess.run(cli_command("goal", text, *args[1:]), cwd=REPO, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert new.returncode == 0, new.stderr
    assert GOAL_ALIAS_NOTE not in new.stderr
    assert json.loads(new.stdout)["outputs"] == report["outputs"]


def test_a_goal_runs_resume_reads_its_config_file_again_but_refuses_a_tiers_pair(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('tiers = "tiers.yaml"\ncascade = true\n')
    _resume_mode_flags("g1", "m", False, None, load_config([str(config)], "resume"))  # the file it started with
    with pytest.raises(UsageError, match=r"--config tiers=t.yaml: key .tiers. applies to plan files"):
        _resume_mode_flags("g1", "m", False, None, load_config(["tiers=t.yaml"], "resume"))
