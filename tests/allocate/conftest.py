"""Shared set-up of the allocation tests that run planweave in a real process against the scripted server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from planweave.testing import RecordedRequest, Reply, Text

Planweave = Callable[..., Awaitable[tuple[int, str, str]]]
"""``await planweave(*args, cwd=PATH)``: the CLI in a subprocess; its exit status, stdout and stderr."""


async def run_planweave(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def planweave() -> Planweave:
    return run_planweave


def planner_script(seen: list[tuple[str, str]], *, bad_model: str | None = None, plan: str | None = None
                   ) -> Callable[[RecordedRequest], Reply]:
    """A scripted goal run: the planner writes one ``noop`` step, or ``plan`` where given (``bad_model``'s plan names
    a tool that does not exist), the joiner answers ``done``; each call is recorded in ``seen`` as (plan or join,
    model)."""

    def script(request: RecordedRequest) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in request.messages)
        model = str(request.body["model"])
        joining = "If the results answer the goal" in text
        seen.append(("join" if joining else "plan", model))
        if joining:
            return Text(json.dumps({"answer": "done"}))
        if model == bad_model:
            return Text(json.dumps({"id": "a", "tool": "no_such_tool", "args": {}}) + "\n")
        if plan is not None:
            return Text(plan)
        return Text(json.dumps({"id": "a", "tool": "noop", "args": {"x": 1}}) + "\n")

    return script
