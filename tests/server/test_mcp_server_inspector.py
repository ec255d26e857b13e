"""An independent MCP client: the MCP Inspector's CLI (``@modelcontextprotocol/inspector``, installed by
scripts/install-mcp-servers.sh) lists planweave's tools and calls one, over stdio (``planweave mcp``) and over
streamable HTTP (``/mcp`` on ``planweave serve``, with the token; refused without it)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_mcp_server_http import TOKEN, serving

REPO = Path(__file__).resolve().parents[2]
INSPECTOR = Path(os.environ.get("PLANWEAVE_MCP_CACHE", REPO / ".cache" / "mcp")) / "node_modules" / ".bin" / \
    "mcp-inspector"
PLANWEAVE = str(Path(sys.executable).parent / "planweave")
SECRET = "sk-inspector-planted-0123456789abcdef"


@pytest.fixture
def inspector() -> Path:
    if not INSPECTOR.exists():
        pytest.fail(f"mcp-inspector is not installed in {INSPECTOR.parents[2]}: run scripts/install-mcp-servers.sh",
                    pytrace=False)
    return INSPECTOR


def inspect(inspector: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The Inspector's CLI with ``args``; its catalog and home kept in ``home``, the secret in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANWEAVE_", "OPENAI_"))}
    env.update(HOME=str(home), MCP_CATALOG_PATH=str(home / "catalog.json"), OPENAI_API_KEY=SECRET)
    return subprocess.run([str(inspector), "--cli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120, check=False)


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON result the Inspector printed first (it may add a line of its own after an error result)."""
    found: dict[str, Any]
    found, _ = json.JSONDecoder().raw_decode(done.stdout.lstrip())
    return found


def test_the_inspector_lists_and_calls_the_tools_of_planweave_mcp_over_stdio(inspector: Path,
                                                                             tmp_path: Path) -> None:
    # The Inspector passes a spawned server only a few variables of its own: the secret is planted with -e.
    server = ["-e", f"OPENAI_API_KEY={SECRET}", PLANWEAVE, "mcp", "--journal", f"sqlite:///{tmp_path / 'runs.db'}"]
    listed = inspect(inspector, tmp_path, *server, "--method", "tools/list")
    plan = json.dumps({"steps": [{"id": "a", "tool": "noop", "args": {"x": 1, "key": SECRET}}]})
    called = inspect(inspector, tmp_path, *server, "--method", "tools/call", "--tool-name", "start_plan",
                     "--tool-arg", f"plan={plan}", "--tool-arg", "run_id=inspected", "--tool-arg", "wait_s=30")
    refused = inspect(inspector, tmp_path, *server, "--method", "tools/call", "--tool-name", "get_run",
                      "--tool-arg", "run_id=nope")
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in result_of(listed)["tools"]}
    assert {"start_plan", "start_goal", "wait_run", "get_run", "approve_step", "send_input", "cancel_run",
            "list_runs", "get_step"} == set(tools)
    assert called.returncode == 0, called.stderr
    run = result_of(called)["structuredContent"]
    assert run["run_id"] == "inspected" and run["task_status"] == "completed"
    assert run["outputs"]["a"]["x"] == 1
    error = result_of(refused)
    assert error["isError"] is True and "no run 'nope'" in error["content"][0]["text"]
    assert SECRET not in listed.stdout + called.stdout + refused.stdout


async def test_the_inspector_reaches_mcp_on_serve_with_the_token_only(inspector: Path, tmp_path: Path) -> None:
    async with serving(tmp_path / "runs.db") as (url, _):
        def run(*headers: str, method: str = "tools/list", extra: tuple[str, ...] = ()) \
                -> subprocess.CompletedProcess[str]:
            flags = [flag for header in headers for flag in ("--header", header)]
            return inspect(inspector, tmp_path, f"{url}/mcp", "--transport", "http", *flags, "--method", method,
                           *extra)

        listed = await asyncio.to_thread(run, f"Authorization: Bearer {TOKEN}")
        called = await asyncio.to_thread(run, f"Authorization: Bearer {TOKEN}", method="tools/call",
                                         extra=("--tool-name", "list_runs"))
        refused = await asyncio.to_thread(run, extra=("--stored-auth-only",))  # no OAuth: our token is the key
    assert listed.returncode == 0, listed.stderr
    assert "start_plan" in {t["name"] for t in result_of(listed)["tools"]}
    assert called.returncode == 0, called.stderr
    assert result_of(called)["structuredContent"] == {"runs": [], "next_cursor": None}
    assert refused.returncode != 0 and "missing or wrong access token" in refused.stderr
