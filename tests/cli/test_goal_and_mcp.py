"""`planweave run --goal` against a scripted OpenAI-compatible server, and `--mcp` / `tools list` from the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines

REPO = Path(__file__).resolve().parents[2]
EVERYTHING = Path(os.environ.get("PLANWEAVE_MCP_CACHE", REPO / ".cache" / "mcp")) / "node_modules" / ".bin" / \
    "mcp-server-everything"


async def planweave(*args: str, cwd: Path, env: dict[str, str] | None = None,
                    inherit: bool = True) -> tuple[int, str, str]:
    """Run the CLI in a real process; ``env`` adds to this process's environment (``inherit=False``: replaces it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd,
        env={**(os.environ if inherit else {}), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_run_goal_plans_executes_and_answers(tmp_path: Path) -> None:
    def script(req: RecordedRequest) -> Reply:
        last = str(req.messages[-1]["content"])
        if "If the results answer the goal" in last:
            return Text(json.dumps({"answer": "both done"}))
        return Text(plan_lines([
            {"id": "a", "tool": "sleep", "args": {"seconds": 0.1, "result": {"t": 21}}},
            {"id": "b", "tool": "noop", "args": {"t": "${a.t}"}},
        ]))

    async with ScriptedLLM(script, ttft=0.05, tokens_per_second=200) as base_url:
        code, out, err = await planweave(
            "goal", "do two things", "--model", "scripted", "--base-url", base_url,
            "--journal", f"sqlite:///{tmp_path / 'runs.db'}", "--budget-tokens", "100000", "--json",
            cwd=tmp_path, env={"OPENAI_API_KEY": "sk-test"},
        )
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "succeeded"
    assert report["answer"] == "both done"
    assert report["tokens"] > 0 and report["cost_usd"] is None  # 'scripted' has no price: unknown, not $0
    versions = report["plan_versions"]
    assert versions[0]["added"] == ["a", "b"]
    assert versions[0]["model_started_at"] <= report["steps"]["a"]["started_at"]
    code, out, _ = await planweave("show", report["run_id"], "--journal", f"sqlite:///{tmp_path / 'runs.db'}",
                                   "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["answer"] == "both done"


async def test_run_goal_with_an_unreachable_model_fails_clearly(tmp_path: Path) -> None:
    code, out, err = await planweave(
        "goal", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--journal", "memory://",
        "--json", cwd=tmp_path, env={"OPENAI_API_KEY": "sk-test"},
    )
    assert code == 1
    report = json.loads(out)
    assert report["status"] == "failed"
    assert "127.0.0.1:9" in report["error"] and "sk-test" not in out + err


async def test_run_with_an_mcp_server_and_tools_list(tmp_path: Path) -> None:
    assert EVERYTHING.exists(), "run scripts/install-mcp-servers.sh"
    spec = f"ev={EVERYTHING}"
    code, out, err = await planweave("tools", "list", "--mcp", spec, "--json", cwd=tmp_path)
    assert code == 0, err
    names = {t["name"] for t in json.loads(out)}
    assert {"ev.echo", "ev.get-sum", "sleep", "shell"} <= names
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "steps:\n"
        "  - {id: e, tool: ev.echo, args: {message: hi}}\n"
        "  - {id: s, tool: ev.get-sum, args: {a: 2, b: 3}}\n"
        "  - {id: both, tool: noop, args: {echo: '${e}', sum: '${s}'}}\n"
    )
    code, out, err = await planweave("run", str(plan), "--mcp", spec, "--journal", "memory://", "--json",
                                     cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["status"] == "succeeded"
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {id: s, tool: ev.get-sum, args: {a: 2, c: 3}}\n")
    code, out, err = await planweave("run", str(bad), "--mcp", spec, "--journal", "memory://", cwd=tmp_path)
    assert code == 2
    assert "step 's'" in err and "'c'" in err
