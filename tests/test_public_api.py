"""The public Python API, seen whole: ``planweave.__all__`` is every public name of the package and nothing else,
each importable and documented in docs/api.md (written from the docstrings by scripts/api_docs.py, and up to date);
a goal runs from Python and its run's events can be followed live."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import planweave
from planweave.journal.memory import MemoryJournal

REPO = Path(__file__).resolve().parents[1]
WEATHER_SCRIPT = "scripted:examples/offline/weather.yaml"  # offline planning, no model (docs/offline.md)
GOAL = "Compare tomorrow's weather in Paris and Rome and recommend one"


def api_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("planweave_api_docs", REPO / "scripts" / "api_docs.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before it runs: its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_public_names_are_exported_and_exist() -> None:
    expected = {
        "Engine", "Run", "RunResult", "Event", "Plan", "PlanSpec", "Step", "RetryPolicy", "Tool", "Toolbox",
        "tool", "builtin_tools", "open_engine", "open_journal", "validate_plan", "parse_plan_document",
        "load_plan_file", "RealClock", "VirtualClock", "run_virtual", "current_step", "StepContext",
        "PlanweaveError", "PlanError", "PlanInvalid", "PlanProblem", "RunError", "RunNotFound", "JournalError",
        "ToolError", "StepFailed", "run_goal", "start_goal", "open_model",
    }
    assert expected <= set(planweave.__all__)
    for name in planweave.__all__:
        assert hasattr(planweave, name), name


def test_all_is_every_public_name_of_the_package_once_and_sorted() -> None:
    for name in planweave.__all__:  # the names load on first use (PEP 562)
        getattr(planweave, name)
    public = {name for name, value in vars(planweave).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert set(planweave.__all__) == public  # nothing public missing from __all__, nothing in it that is not there
    assert len(planweave.__all__) == len(set(planweave.__all__))
    assert planweave.__all__ == sorted(planweave.__all__, key=lambda n: (not n.isupper(), n[0].islower(), n))


def test_every_name_in_all_is_importable_from_the_package() -> None:
    for name in planweave.__all__:
        namespace: dict[str, object] = {}
        exec(f"from planweave import {name}", namespace)  # the import a user writes
        assert namespace[name] is getattr(planweave, name)


def test_every_name_in_all_is_documented_in_docs_api_md() -> None:
    entries = api_docs().entries()
    assert [e.name for e in entries] == list(planweave.__all__)
    assert [e.name for e in entries if not e.doc.strip()] == []  # a docstring (a constant: the string after it)
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    for name in planweave.__all__:
        assert f"\n## {name}\n" in text, name


def test_docs_api_md_is_what_the_script_writes() -> None:
    written = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert written == api_docs().render(), "docs/api.md is out of date: run .venv/bin/python scripts/api_docs.py"


def test_errors_form_one_hierarchy() -> None:
    for name in ("PlanError", "PlanInvalid", "RunError", "RunNotFound", "JournalError", "ToolError", "StepFailed"):
        assert issubclass(getattr(planweave, name), planweave.PlanweaveError)


def test_run_goal_plans_and_runs_a_goal_on_the_scripted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.weather import toolbox

    monkeypatch.chdir(REPO)  # the script's path is relative, as in docs/offline.md
    journal = MemoryJournal("memory://")

    async def main() -> planweave.RunResult:
        return await planweave.run_goal(GOAL, tools=toolbox, model=WEATHER_SCRIPT, journal=journal, deadline=60.0,
                                        budget_tokens=100_000)

    result = asyncio.run(main())
    assert result.ok and result.answer == "Go with the recommendation of step pick: it is warmer and drier."
    assert sorted(result.outputs) == ["paris", "pick", "rome"]
    created = asyncio.run(journal.read(result.run_id, kind="run_created"))[0]
    limits = created.data["options"]["limits"]  # journaled as the CLI journals them: a resume applies them again
    assert limits["model"] == WEATHER_SCRIPT and limits["deadline"] == 60.0 and limits["budget_tokens"] == 100_000
    kinds = [e.kind for e in asyncio.run(journal.read(result.run_id))]
    assert kinds[0] == "run_created" and "forecast" in kinds and kinds[-1] == "run_finished"  # its live forecast


def test_run_events_follow_a_run_live_from_its_start_or_a_position(monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.weather import toolbox

    monkeypatch.chdir(REPO)

    async def main() -> tuple[list[planweave.Event], list[planweave.Event], list[planweave.Event]]:
        async with planweave.open_model(WEATHER_SCRIPT) as model, \
                planweave.open_engine("memory://", tools=toolbox) as engine:
            run = await planweave.start_goal(engine, GOAL, model=model)
            live = [event async for event in run.events()]  # ends when the run ends
            result = await run.wait()
            assert result.ok
            stored = await engine.journal.read(run.id)
            middle = live[len(live) // 2].pos
            assert middle is not None
            return live, stored, [event async for event in run.events(after=middle)]

    live, stored, rest = asyncio.run(main())
    assert live == stored  # every event, once, in order, with its position
    assert live[0].kind == "run_created" and live[-1].kind == "run_finished"
    assert rest == live[len(live) // 2 + 1:]  # after a position: the events past it (a finished run: at once)


def readme_block(lead: str) -> str:
    """The first ``python`` block after the paragraph of README.md that opens with ``lead``."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text[text.index(lead):]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("```\n", start)]


def test_the_readme_goals_from_python_snippet_runs_as_shown() -> None:
    code = readme_block("**Goals from Python.**")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "succeeded Go with the recommendation of step pick: it is warmer and drier."
    kinds = [line.split()[1] for line in lines[1:]]
    assert kinds[0] == "run_created" and kinds[-1] == "run_finished" and "step_succeeded" in kinds
    assert [int(line.split()[0]) for line in lines[1:]] == list(range(1, len(lines)))  # each event once, in order


def test_run_events_end_when_the_engine_closes_under_the_run() -> None:
    seen: list[str] = []

    async def main() -> None:
        async with planweave.open_engine("memory://") as engine:
            run = await engine.start({"steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 3600}}]})

            async def follow() -> None:
                async for event in run.events():
                    seen.append(f"{event.kind}:{event.step}")

            follower = asyncio.create_task(follow())  # not the engine's: closing it does not cancel this one
            await asyncio.sleep(1)
        # the engine closed: the run is interrupted (resumable), and the iteration ends rather than hangs
        await asyncio.wait_for(follower, 10)

    planweave.run_virtual(main())
    assert seen == ["run_created:None", "step_started:nap"]
