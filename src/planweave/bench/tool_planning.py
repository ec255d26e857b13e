"""Tool-call planning vs JSON Lines planning on the planning benchmark's goals (``planweave.bench.planning``).

The same seeded goals (layered DAGs of 10-40 steps, a fraction of steps failing once and repaired), the same tools,
the same scripted model speed, once with the planner asked for JSON Lines in text (``plan_via="text"``) and once
offered ``add_step`` and answering with one streamed call per step (``plan_via="tools"``), in Chat Completions or
Anthropic Messages. Measured per mode: time from the planner's request to the first tool call of the run, end to end
time, planner replies whose steps were all accepted (plan validity), steps rejected, model calls and tokens.

The scripted model writes valid plans in both modes by construction, so validity here only shows that the parsing
path loses nothing; how often a real model writes an invalid step in either mode is not measured. The scripted
server counts prompt tokens from the messages only, so the request's tool definitions are counted here by the same
rule (about four characters a token, :func:`_tools_tokens`); a provider's own tool-use preamble is not included.

``python -m planweave.bench.tool_planning [--json] [--virtual] [--dialect anthropic]``
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from planweave import open_engine, run_virtual
from planweave.bench.cli import parse_command_line
from planweave.bench.planning import Goal, _clock, _now, _tools, make_goals, script_for
from planweave.engine.runtime import RunResult
from planweave.models.anthropic import AnthropicClient
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.testing.scripted_planner import offers_add_step, step_calls

MODES = ("text", "tools")
CLIENTS: dict[str, type[OpenAIChatClient]] = {"chat": OpenAIChatClient, "anthropic": AnthropicClient}


def _tools_tokens(req: RecordedRequest) -> int:
    """The request's tool definitions in tokens, by the scripted server's own rule for messages."""
    tools = req.body.get("tools") if isinstance(req.body, dict) else None
    return math.ceil(len(json.dumps(tools, separators=(",", ":"))) / 4) if tools else 0


def _prompt_tokens(req: RecordedRequest) -> int:
    messages = sum(math.ceil(len(str(m.get("content") or "")) / 4) + 4 for m in req.messages) + 2
    return messages + _tools_tokens(req)


def tool_script(goal: Goal) -> Any:
    """The planning benchmark's scripted model, answering in ``add_step`` calls when they are offered."""
    text_reply = script_for(goal)

    def reply(req: RecordedRequest) -> Reply:
        answer: Reply = text_reply(req)
        if not isinstance(answer, Text):
            return answer
        prompt = _prompt_tokens(req)
        lines = [line for line in answer.text.splitlines() if line.strip()]
        steps = [json.loads(line) for line in lines if line.startswith("{") and '"id"' in line]
        if offers_add_step(req) and steps and len(steps) == len(lines):
            return Text("", tool_calls=step_calls(steps), prompt_tokens=prompt)
        return Text(answer.text, prompt_tokens=prompt)

    return reply


@dataclass
class ModeRun:
    first_call: float
    end_to_end: float
    replies: int  # planner replies (plan, repairs, re-plans)
    valid_replies: int  # of those, replies whose steps were all accepted
    rejected: int  # steps or lines rejected (repair_lines escalations' errors)
    model_calls: int
    prompt_tokens: int
    completion_tokens: int


async def _run(goal: Goal, mode: str, dialect: str, *, ttft: float, tps: float) -> ModeRun:
    executions: Counter[str] = Counter()
    tools = _tools(executions)
    server = ScriptedLLM(tool_script(goal), ttft=ttft, tokens_per_second=tps)
    async with server as base_url, CLIENTS[dialect]("scripted", base_url=base_url, api_key="bench") as client, \
            open_engine("memory://", tools=tools, clock=_clock()) as engine:
        t0 = _now()
        options = PlanningOptions(plan_via="tools" if mode == "tools" else "text")
        result: RunResult = await PlanningLoop(engine, client, tools, options=options).run(goal.name)
        elapsed = _now() - t0
    state = result.state
    if result.status != "succeeded":
        raise RuntimeError(f"{goal.name} ({mode}) did not succeed: {result.error}")
    planner = [c for c in state.model_calls if "plan_via" in c]
    if {c["plan_via"] for c in planner} != {mode}:
        raise RuntimeError(f"{goal.name}: the planner was asked via {sorted({c['plan_via'] for c in planner})}, "
                           f"not {mode}")
    asked = min(float(c["started_at"]) for c in planner if c["purpose"] == "plan")  # the initial plan's request
    first = min(rec.attempt_log[0][1] for rec in [*state.records.values(), *(r for _, r in state.retired)]
                if rec.attempt_log) - asked
    repairs = [e for e in state.escalations if e.get("rung") == "repair_lines"]
    return ModeRun(first, elapsed, len(planner), len(planner) - len(repairs),
                   sum(str(e.get("reason", "")).count("; ") + 1 for e in repairs), len(state.model_calls),
                   sum(int(c["prompt_tokens"]) for c in state.model_calls),
                   sum(int(c["completion_tokens"]) for c in state.model_calls))


async def measure(goals: Sequence[Goal], *, dialect: str, ttft: float, tps: float) -> dict[str, Any]:
    """Both modes on every goal; sums over goals, per mode."""
    runs: dict[str, list[ModeRun]] = {mode: [] for mode in MODES}
    for goal in goals:
        for mode in MODES:
            runs[mode].append(await _run(goal, mode, dialect, ttft=ttft, tps=tps))

    def total(mode: str, attr: str) -> float:
        return round(float(sum(getattr(r, attr) for r in runs[mode])), 3)

    fields = ("first_call", "end_to_end", "replies", "valid_replies", "rejected", "model_calls", "prompt_tokens",
              "completion_tokens")
    return {
        "modes": {mode: {f: total(mode, f) for f in fields} for mode in MODES},
        "goals": [{"name": g.name, "steps": len(g.steps)} for g in goals],
        "dialect": dialect,
        "model": {"ttft_s": ttft, "tokens_per_s": tps},
        "clock": "virtual" if type(_clock()).__name__ == "VirtualClock" else "real",
    }


@dataclass(frozen=True)
class _Options:
    goals: int
    seed: int
    ttft: float
    tps: float
    step_ms: float
    dialect: str
    json: bool
    virtual: bool


def _options(
    goals: Annotated[int, typer.Option(min=1, help="goals to plan and run")] = 3,
    seed: Annotated[int, typer.Option(help="seed of the goals' random plans")] = 7,
    ttft: Annotated[float, typer.Option(help="the scripted model's time to first token (s)")] = 0.3,
    tps: Annotated[float, typer.Option(help="the scripted model's tokens per second")] = 30.0,
    step_ms: Annotated[float, typer.Option(help="median tool latency (lognormal)")] = 1000.0,
    dialect: Annotated[str, typer.Option(help="chat or anthropic")] = "chat",
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
    virtual: Annotated[bool, typer.Option("--virtual", help="on the virtual clock (the same figures every run)")]
    = False,
) -> _Options:
    """Tool-call planning vs JSON Lines planning on the planning benchmark's goals, on a scripted model."""
    if dialect not in CLIENTS:
        raise typer.BadParameter(f"--dialect must be one of {', '.join(CLIENTS)}, not '{dialect}'")
    return _Options(goals, seed, ttft, tps, step_ms, dialect, json_output, virtual)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print the table (or ``--json``)."""
    args = parse_command_line(_options, argv, "python -m planweave.bench.tool_planning")
    goals = make_goals(args.goals, args.seed, mean_ms=args.step_ms)
    data = (run_virtual if args.virtual else asyncio.run)(
        measure(goals, dialect=args.dialect, ttft=args.ttft, tps=args.tps))
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"tool-call planning: {len(goals)} goals ({', '.join(str(g['steps']) for g in data['goals'])} steps), "
          f"{args.dialect} dialect, model ttft {args.ttft}s at {args.tps:g} tokens/s, {data['clock']} clock")
    text, tools = data["modes"]["text"], data["modes"]["tools"]
    rows = [("time to first tool call (s)", "first_call"), ("end to end (s)", "end_to_end"),
            ("planner replies valid", "valid_replies"), ("steps rejected", "rejected"),
            ("model calls", "model_calls"), ("prompt tokens", "prompt_tokens"),
            ("completion tokens", "completion_tokens")]
    print(f"  {'':<30} {'JSON Lines':>12} {'add_step':>12}")
    for label, key in rows:
        left, right = text[key], tools[key]
        if key == "valid_replies":
            left, right = f"{left:g}/{text['replies']:g}", f"{right:g}/{tools['replies']:g}"
        print(f"  {label:<30} {left:>12} {right:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
