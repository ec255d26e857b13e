"""``planweave run --goal --memory`` in a real process against the scripted server: the first run is distilled and
its skill verified by replay; the next related goal's planner prompt carries the skill and its plan is short."""

from __future__ import annotations

import json
from pathlib import Path

from planweave.bench.memory import scripted_planner
from planweave.testing.scripted_llm import ScriptedLLM
from tests.cli.test_goal_and_mcp import REPO, planweave

TOOLS = "tests.memory.memory_tools:toolbox"


async def test_a_goal_run_with_memory_learns_a_verified_skill_the_next_run_reuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    server = ScriptedLLM(scripted_planner)
    env = {"OPENAI_API_KEY": "sk-test", "PYTHONPATH": str(REPO)}
    async with server as base_url:
        common = ("--model", "scripted", "--base-url", base_url, "--journal", url, "--tools", TOOLS, "--memory",
                  "--json")  # the real clock: on the virtual one a loaded machine let the HTTP timeout fire early
        code, out, err = await planweave("goal", "weather report for oslo", *common, cwd=tmp_path, env=env)
        assert code == 0, err
        assert len(json.loads(out)["steps"]) == 9  # no memory yet: the long exploratory plan
        assert "skill 'city-report' v1 admitted (replay run" in err
        # Its check (a `work` step echoing its arguments) compares nothing: no verification, left for a person.
        assert "lesson 'weather-sources' v1 candidate (left for a person: its check cannot fail" in err
        code, out, err = await planweave("goal", "weather report for lima", *common, cwd=tmp_path, env=env)
        assert code == 0, err
        assert sorted(json.loads(out)["steps"]) == ["fetch", "report"]  # the recalled skill's short plan
    plans = [r for r in server.chat_requests if "Write the plan." in str(r.messages[-1]["content"])]
    assert "Memory from earlier runs" not in str(plans[0].messages[-1]["content"])
    assert "skill 'city-report' v1" in str(plans[1].messages[-1]["content"])
    code, out, _ = await planweave("memory", "list", "--journal", url, "--json", cwd=tmp_path, env=env)
    entries = json.loads(out)
    assert sorted(e["name"] for e in entries) == ["city-report", "weather-sources"]  # run 2 restated them: no v2
    listed = {e["name"]: e for e in entries}
    assert listed["city-report"]["uses"] == 1 and listed["city-report"]["status"] == "admitted"
    assert listed["city-report"]["provenance"]["step_ids"] == ["fetch", "report"]


async def test_memory_flags_are_refused_where_they_cannot_apply(tmp_path: Path) -> None:
    code, _, err = await planweave("goal", "x", "--memory", "--journal", "memory://", cwd=tmp_path)
    assert code == 2 and "--memory keeps lessons and skills in the journal's database" in err
    code, _, err = await planweave("goal", "x", "--config", "memory_model=m", cwd=tmp_path)
    assert code == 2 and "key 'memory_model' applies with --memory" in err
    plan = tmp_path / "p.yaml"
    plan.write_text("steps: [{id: a, tool: noop}]\n")
    code, _, err = await planweave("run", str(plan), "--memory", cwd=tmp_path)
    assert code == 2 and "No such option: --memory" in err
