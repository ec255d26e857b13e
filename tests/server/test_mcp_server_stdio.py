"""``planweave mcp`` spawned by the SDK's stdio client, on a SQLite journal: a plan started, waited for and read; a
goal planned offline (``--model scripted:...``, docs/offline.md); the runs stay in the journal for the next
session; nothing a client receives holds the planted secret."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
PLANWEAVE = str(Path(sys.executable).parent / "planweave")
SECRET = "sk-stdio-planted-0123456789abcdef"
WEATHER = "scripted:examples/offline/weather.yaml"
GOAL = "Compare tomorrow's weather in Paris and Rome and recommend one"


@asynccontextmanager
async def stdio_session(journal: Path, *flags: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A client of a fresh ``planweave mcp`` process on ``journal``, and the list every response is added to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_", "OPENAI_"))}
    env["OPENAI_API_KEY"] = SECRET
    params = StdioServerParameters(command=PLANWEAVE, args=["mcp", "--journal", f"sqlite:///{journal}", *flags],
                                   env=env, cwd=str(REPO))
    seen: list[str] = []
    async with Client(params) as client:

        async def call(name: str, args: dict[str, Any]) -> Any:
            async def progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(f"{progress} {total} {message}")

            result = await client.call_tool(name, args, progress_callback=progress)
            seen.append(result.model_dump_json())
            return result

        yield call, seen


async def test_a_plan_started_over_stdio_is_waited_for_and_its_outputs_read(tmp_path: Path) -> None:
    journal = tmp_path / "runs.db"
    plan = {"steps": [{"id": "a", "tool": "noop", "args": {"token": SECRET, "n": 1}},
                      {"id": "b", "tool": "noop", "args": {"from_a": "${a.n}"}, "after": ["a"]}]}
    async with stdio_session(journal) as (call, seen):
        started = await call("start_plan", {"plan": plan, "run_id": "over-stdio"})
        done = (await call("wait_run", {"run_id": "over-stdio", "timeout_s": 30})).structured_content
        step = (await call("get_step", {"run_id": "over-stdio", "step": "a"})).structured_content
    assert started.structured_content == {"run_id": "over-stdio", "status": "running"}
    assert done["task_status"] == "completed" and done["outputs"]["b"] == {"from_a": 1}
    assert step["args"]["token"].startswith("***$OPENAI_API_KEY")  # sealed in the journal, as GET shows it
    async with stdio_session(journal) as (call, again):  # the journal keeps it for the next session
        listed = (await call("list_runs", {})).structured_content
        report = (await call("get_run", {"run_id": "over-stdio"})).structured_content
    assert [r["run_id"] for r in listed["runs"]] == ["over-stdio"]
    assert report["status"] == "succeeded" and report["outputs"] == done["outputs"]
    assert not [text for text in seen + again if SECRET in text]


async def test_a_goal_planned_offline_with_a_scripted_model_over_stdio(tmp_path: Path) -> None:
    async with stdio_session(tmp_path / "runs.db", "--tools", "examples.weather:toolbox", "--model", WEATHER) \
            as (call, seen):
        wrong = await call("start_goal", {"goal": GOAL, "model": "gpt-4o"})
        done = (await call("start_goal", {"goal": GOAL, "model": WEATHER, "run_id": "weather", "budget_tokens": 50000,
                                          "wait_s": 60})).structured_content
    assert wrong.is_error and WEATHER in wrong.content[0].text
    assert done["task_status"] == "completed", done
    assert done["answer"].startswith("Go with the recommendation of step pick")
    assert set(done["outputs"]) == {"paris", "rome", "pick"}
    assert any(" of 3 steps ended" in text for text in seen)  # progress notifications reached the client
    assert not [text for text in seen if SECRET in text]
