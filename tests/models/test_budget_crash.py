"""A token budget holds across SIGKILLs: every budgeted model call journals its worst case (``model_reserved``)
durably before its request goes out, and a resume counts a call the kill left unsettled as spent at that worst
case. Real ``planweave`` processes, real SIGKILL mid-stream, the scripted OpenAI-compatible server as the model
(it counts every token it bills, cut streams included)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from planweave import open_journal
from planweave.core.state import RunState
from planweave.limits import JournaledLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines

ENV = {**os.environ, "OPENAI_API_KEY": "sk-test-key-123456"}
STEPS = 10
# Ten llm steps one after another, each asking for up to 100 tokens (about 115 with its prompt): more than a budget
# of 1,000 tokens allows, so the run spends its budget to the end.
CHAIN = "steps:\n" + "".join(
    f"  - {{id: s{i}, tool: llm, args: {{prompt: 'Write part {i} of the story.', max_tokens: 100}}"
    + (f", after: [s{i - 1}]}}\n" if i else "}\n") for i in range(STEPS))
LONG = Text("word " * 400)  # cut at the request's max_tokens by the server


async def start(*args: str, cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", *args, cwd=cwd, env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def kill_mid_stream(proc: asyncio.subprocess.Process, server: ScriptedLLM, *, call: int,
                          streamed: int = 30) -> None:
    """SIGKILL ``proc`` while its ``call``-th chat call (1-based, counted from now) is streaming and has sent at
    least ``streamed`` tokens: the server billed them, the process never learns of it."""
    first = len(server.served)
    for _ in range(1200):  # the server runs on this loop: poll it (bounded: 60 s)
        mine = server.served[first:]
        if len(mine) >= call and mine[call - 1].ended is None and mine[call - 1].completion_tokens >= streamed:
            break
        assert proc.returncode is None, f"the run ended before it could be killed: {await proc.communicate()}"
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"no chat call #{call} streaming {streamed} tokens: {server.served[first:]}")
    proc.send_signal(signal.SIGKILL)
    await proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert mine[call - 1].ended is None or mine[call - 1].completion_tokens < 100  # killed mid-stream


async def test_a_token_budget_holds_across_five_kills_mid_stream(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(CHAIN)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    budget = 1000
    server = ScriptedLLM(default=LONG, tokens_per_second=100, honour_max_tokens=True)
    async with server as base_url:
        proc = await start("run", "plan.yaml", "--run-id", "r1", "--model", "scripted", "--base-url", base_url,
                           "--budget-tokens", str(budget), "--journal", url, "--json", cwd=tmp_path)
        await kill_mid_stream(proc, server, call=1)
        for kill in range(1, 5):
            proc = await start("resume", "r1", "--base-url", base_url, "--journal", url, "--json", cwd=tmp_path)
            await kill_mid_stream(proc, server, call=1 + kill % 2)
        async with open_journal(url) as journal:
            events = await journal.read("r1")
        limits = JournaledLimits.from_events(events)
        proc = await start("resume", "r1", "--base-url", base_url, "--journal", url, "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        billed = server.billed_tokens
    report = json.loads(out)
    print(f"budget {budget}: the server billed {billed} tokens, the run reports {report['tokens']} "
          f"({report.get('reserved_unsettled', {}).get('tokens', 0)} of them reserved by calls the kills cut), "
          f"{report['status']}")
    assert billed <= budget, (billed, report["tokens"], err.decode()[-2000:])
    assert report["tokens"] >= billed
    assert report["tokens"] <= budget
    unsettled = report["reserved_unsettled"]
    assert unsettled["calls"] == 5 and all(u["purpose"] == "llm_step" for u in unsettled["each"])
    assert limits.unsettled_tokens == unsettled["tokens"] and limits.spent_tokens >= limits.unsettled_tokens


async def test_an_interrupted_planner_call_counts_in_the_resumed_runs_tokens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    def script(req: RecordedRequest) -> Reply:
        if "If the results answer the goal" in str(req.messages[-1]["content"]):
            return Text(json.dumps({"answer": "done"}))
        # A slow plan: a long report line first, so the kill comes mid-stream.
        return Text(json.dumps({"report": "thinking " * 60}) + "\n"
                    + plan_lines([{"id": "quick", "tool": "noop", "args": {"v": 1}}]))

    server = ScriptedLLM(script, tokens_per_second=100)
    async with server as base_url:
        proc = await start("run", "--goal", "g", "--run-id", "g1", "--model", "scripted", "--base-url", base_url,
                           "--budget-tokens", "20000", "--journal", url, "--json", cwd=tmp_path)
        await kill_mid_stream(proc, server, call=1)
        cut = server.billed_tokens
        async with open_journal(url) as journal:
            killed = RunState.from_events("g1", await journal.read("g1"))
        assert killed.tokens == 0 and [r["purpose"] for r in killed.reserved.values()] == ["plan"]
        proc = await start("resume", "g1", "--model", "scripted", "--base-url", base_url, "--journal", url,
                           "--json", cwd=tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        billed = server.billed_tokens
    report = json.loads(out)
    unsettled = report["reserved_unsettled"]
    print(f"planner cut after {cut} billed tokens, reserved {unsettled['tokens']}; the server billed {billed} in all, "
          f"the resumed run reports {report['tokens']}, {report['status']}")
    assert unsettled["calls"] == 1 and unsettled["each"][0]["purpose"] == "plan", unsettled
    assert unsettled["tokens"] >= cut  # the interrupted call counted at its worst case, at least what it billed
    assert report["tokens"] >= billed, (report["tokens"], billed, err.decode()[-2000:])
