"""`planweave run` limits as a user gives them: a plan file's deadline, model and budget; flags that do not apply."""

from __future__ import annotations

import json
from pathlib import Path

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines

from .test_goal_and_mcp import planweave

SLOW = "steps:\n  - {id: slow, tool: sleep, args: {seconds: 3}}\n"
ASKS = ("steps:\n"
        "  - {id: ask, tool: llm, args: {prompt: 'Name a colour', max_tokens: 200}}\n"
        "  - {id: use, tool: noop, args: {colour: '${ask.text}'}}\n")
KEY = {"OPENAI_API_KEY": "sk-test-key-123456"}


def journal(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


async def test_a_plan_files_deadline_stops_the_run(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(SLOW)
    code, out, err = await planweave("run", "plan.yaml", "--deadline", "0.5", "--journal", journal(tmp_path),
                                     "--json", cwd=tmp_path)
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "cancelled"
    assert report["error"] == "deadline of 0.5s reached"
    assert report["steps"]["slow"]["status"] == "cancelled"
    assert 0.5 <= report["makespan_s"] < 2.5  # stopped at the deadline, not after the 3 s step


async def test_flags_that_do_not_apply_to_a_plan_file_are_errors(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(SLOW)
    for flags, named in ((["--max-replans", "2"], "No such option: --max-replans"),
                         (["--plan-max-tokens", "100"], "--plan-max-tokens is a key of the run configuration"),
                         (["--config", "plan_max_tokens=100"], "key 'plan_max_tokens' applies to goal runs"),
                         (["--budget-tokens", "100"], "--budget-tokens"),
                         (["--base-url", "http://127.0.0.1:9/v1"], "--base-url")):
        code, out, err = await planweave("run", "plan.yaml", *flags, "--journal", journal(tmp_path), cwd=tmp_path,
                                         env={"PLANWEAVE_MODEL": ""})
        assert code == 2, (flags, out, err)
        assert named in err, (flags, err)
        assert "Traceback" not in err
    assert not (tmp_path / "runs.db").exists()


async def test_a_plan_file_calls_the_model_given_with_model(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(ASKS)
    async with ScriptedLLM([Text("teal")]) as base_url:
        code, out, err = await planweave("run", "plan.yaml", "--model", "scripted", "--base-url", base_url,
                                         "--journal", journal(tmp_path), "--json", cwd=tmp_path, env=KEY)
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "succeeded"
    assert report["outputs"]["use"] == {"colour": "teal"}


async def test_a_plan_files_budget_bounds_its_llm_steps(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(ASKS)
    async with ScriptedLLM([Text("teal")]) as base_url:
        code, out, err = await planweave("run", "plan.yaml", "--model", "scripted", "--base-url", base_url,
                                         "--budget-tokens", "50", "--journal", journal(tmp_path), "--json",
                                         cwd=tmp_path, env=KEY)
    assert code == 1, err
    step = json.loads(out)["steps"]["ask"]
    assert step["status"] == "failed" and "budget" in step["error"]


async def test_a_goal_run_prints_its_answer(tmp_path: Path) -> None:
    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "the answer is 42"}))
        return Text(plan_lines([{"id": "a", "tool": "noop", "args": {"x": 42}}]))

    async with ScriptedLLM(script) as base_url:
        code, out, err = await planweave("goal", "find the answer", "--model", "scripted", "--base-url",
                                         base_url, "--journal", journal(tmp_path), cwd=tmp_path, env=KEY)
    assert code == 0, err
    assert "answer: the answer is 42" in out
