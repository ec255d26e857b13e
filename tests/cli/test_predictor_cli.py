"""``planweave run --predictor-model`` and a plan's ``speculation: {predictor: ...}``: a cheap model on a second
scripted OpenAI-compatible server predicts ``a``'s reply, ``b`` starts on it and is adopted; the outputs are those of
the run without speculation; a predictor for a run that does not speculate exits 2 naming the flag. The CLI runs in
this process (in a thread: the scripted servers serve on the test's loop)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planweave.cli.main import app
from planweave.journal import open_journal
from planweave.testing import ScriptedLLM, Text
from planweave.testing.scripted_llm import RecordedRequest

from ..engine.test_speculation_predictor import MODEL, PREDICT, main_model, reply_to

PLAN = {"steps": [
    {"id": "a", "tool": "llm", "args": {"prompt": "name a colour", "max_tokens": 16}},
    {"id": "b", "tool": "llm", "args": {"prompt": "a poem about ${a.text}", "max_tokens": 16}},
]}


def cheap(req: RecordedRequest) -> Text:
    return Text(reply_to(str(req.messages[-1]["content"]).split(PREDICT, 1)[-1]))


def invoke(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None,
                          "OPENAI_API_KEY": "sk-predictor-test"}).invoke(app, list(args))


async def run_plan(tmp_path: Path, name: str, speculation: dict[str, Any] | None, *flags: str) -> tuple[Any, str]:
    async with ScriptedLLM(main_model, ttft=0.3, models=(MODEL,)) as main_url, \
            ScriptedLLM(cheap, ttft=0.02, models=(MODEL,)) as cheap_url:
        doc: dict[str, Any] = dict(PLAN)
        if speculation is not None:  # the predictor asks the cheap server
            doc["speculation"] = {**speculation, "predictor": {**speculation["predictor"], "base_url": cheap_url}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        journal = f"sqlite:///{tmp_path / (name + '.db')}"
        result = await asyncio.to_thread(invoke, "run", str(tmp_path / f"{name}.yaml"), "--model", MODEL,
                                         "--base-url", main_url, "--journal", journal, "--json", *flags)
    return result, journal


async def events_of(journal: str, run_id: str) -> list[Any]:
    async with open_journal(journal) as opened:
        return list(await opened.read(run_id))


@pytest.mark.parametrize("flags", [(), ("--config", f"predictor_model={MODEL}")])
async def test_a_predictor_from_the_plan_or_the_flag_starts_b_early_without_changing_outputs(
        tmp_path: Path, flags: tuple[str, ...]) -> None:
    off, _ = await run_plan(tmp_path, "off", None)
    assert off.exit_code == 0, off.output
    predictor = {"model": "no-such-model" if flags else MODEL, "max_tokens": 64}
    on, journal = await run_plan(tmp_path, "on", {"mode": "safe", "max_extra_cost_usd": 0.01,
                                                  "predictor": predictor}, *flags)
    assert on.exit_code == 0, on.output
    report, plain = json.loads(on.stdout), json.loads(off.stdout)
    assert report["outputs"] == plain["outputs"]
    events = await events_of(journal, report["run_id"])
    assert [e.step for e in events if e.kind == "speculation_adopted"] == ["b"]
    (call,) = [e for e in events if e.kind == "model_call" and e.data.get("purpose") == "predict"]
    assert call.data["speculative"] is True and call.data["cost_usd"] > 0
    # run --json's speculation summary counts the predictor's call as speculation's extra model call and cost.
    spec = report["speculation"]
    assert (spec["started"], spec["adopted"], spec["discarded"], spec["extra_model_calls"]) == (1, 1, 0, 1)
    assert spec["extra_tokens"] == call.data["prompt_tokens"] + call.data["completion_tokens"] > 0
    assert spec["total_extra_cost_usd"] == spec["extra_calls_cost_usd"] == round(call.data["cost_usd"], 8)
    assert spec["head_start_s"] > 0
    assert "speculation" not in plain


async def test_a_predictor_for_a_run_that_does_not_speculate_exits_2(tmp_path: Path) -> None:
    result, _ = await run_plan(tmp_path, "bad", None, "--config", f"predictor_model={MODEL}")
    assert result.exit_code == 2
    assert "key 'predictor_model' applies to a run that speculates" in result.output
    assert "Traceback" not in result.output
