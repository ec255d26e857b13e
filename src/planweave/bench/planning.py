"""The planning benchmark: streaming admission, concurrent vs synchronous re-planning vs a ReAct loop.

Every system talks to the same scripted OpenAI-compatible server (real HTTP on 127.0.0.1, streaming at a realistic
speed: time to first token and tokens per second) and runs the same tools (lognormal latencies, real sleeps), on the
same seeded goals whose plans are DAGs of 10-40 steps. A fraction of steps fails once: the model is then asked to
repair, and the replacement succeeds.

Measured:
1. time to the first tool call: streaming admission vs admitting the plan only once the model has finished;
2. end-to-end time, and executor idle time (no step running while the run is not over): planweave's concurrent
   re-planning vs a synchronous re-planner (re-plans only once every step stopped, LLMCompiler's way) vs a
   sequential ReAct loop (one model call per step);
3. steps re-executed (the same work run more than once) with local repair vs with global re-planning;
4. model calls and tokens per goal and system, so that a planner that spends extra round trips shows.

With ``--virtual`` every system runs on the virtual clock (:func:`planweave.run_virtual`): the scripted model's
time to first token and token pace and the tools' sleeps are virtual time, so the figures are the same on every run
and take a few seconds of wall time; ``tests/bench/test_planning_orderings.py`` asserts the orderings above on them.
Without it, real time (what the figures in docs/benchmarks.md are, beside the virtual ones).

``planweave bench planning [--json] [--quick] [--virtual]`` or ``python -m planweave.bench.planning``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any

import typer

from planweave import Clock, RealClock, Toolbox, VirtualClock, builtin_tools, current_step, open_engine, run_virtual
from planweave.bench.cli import parse_command_line
from planweave.core.clock import VirtualEventLoop
from planweave.core.context import StepContext, set_current_step
from planweave.core.state import RunState
from planweave.engine.runtime import RunResult
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines


@dataclass(frozen=True)
class Goal:
    """A goal and the plan the scripted model writes for it: steps with latencies, some flaky on first try."""

    name: str
    steps: tuple[dict[str, Any], ...]


def make_goals(count: int, seed: int, *, fail_rate: float = 0.2, mean_ms: float = 200.0) -> list[Goal]:
    """Seeded goals whose plans are layered DAGs of 10-40 steps with lognormal step latencies."""
    rng = random.Random(seed)
    goals = []
    for g in range(count):
        n = rng.randint(10, 40)
        layers = max(2, round(math.sqrt(n)))
        ids = [f"t{i}" for i in range(n)]
        layer_of = {sid: min(layers - 1, i * layers // n) for i, sid in enumerate(ids)}
        steps = []
        for sid in ids:
            earlier = [o for o in ids if layer_of[o] == layer_of[sid] - 1]
            parents = rng.sample(earlier, k=min(len(earlier), rng.randint(1, 2))) if earlier else []
            ms = round(rng.lognormvariate(math.log(mean_ms), 0.5))
            args: dict[str, Any] = {"ms": ms}
            if rng.random() < fail_rate:
                args["flaky"] = True
            steps.append({"id": sid, "tool": "work", "args": args, **({"after": parents} if parents else {})})
        goals.append(Goal(f"goal {g}", tuple(steps)))
    return goals


def _tools(executions: Counter[str]) -> Toolbox:
    box = builtin_tools()

    async def work(ms: int, flaky: bool = False, variant: int = 0) -> dict[str, Any]:
        """Do some work that takes `ms` milliseconds; `flaky` work fails."""
        step = current_step().step_id  # the same args under another id is other work, not a re-execution
        executions[json.dumps({"step": step, "ms": ms, "flaky": flaky, "variant": variant})] += 1
        await asyncio.sleep(ms / 1000)
        if flaky:
            raise ConnectionError("flaky service")
        return {"ms": ms}

    box.add(work, idempotent=True)
    return box


_FAILED = re.compile(r"Step ('[^']+'(?:, '[^']+')*) failed for good")
_REGION = re.compile(r"depended on it \(([^)]*)\)")
# A finished step as a prompt lists it: by reference (``- t0 (work, 11 chars): ...``, the default context) or in
# the state summary (``- t0 (work) -> ...``). The scripted planner restates only the steps not listed as done.
_DONE = re.compile(r"^- (\S+) \(work(?:\) ->|, \d+ chars\):)", flags=re.M)


def _fixed(step: dict[str, Any]) -> dict[str, Any]:
    args = {k: v for k, v in step["args"].items() if k != "flaky"}
    if step["args"].get("flaky"):
        args["variant"] = 1
    return {**step, "args": args}


def _repair_ids(prompt: str) -> list[str]:
    """The failed steps and their downstream region, as a repair prompt names them (the model restates them all)."""
    failed = _FAILED.search(prompt)
    region = _REGION.search(prompt)
    ids = [s.strip().strip("'") for s in failed.group(1).split(",")] if failed else []
    ids += [s.strip() for s in region.group(1).split(",")] if region else []
    return list(dict.fromkeys(ids))


def script_for(goal: Goal) -> Any:
    """The scripted model for one goal: the plan, region repairs, global re-plans, answers."""
    by_id = {s["id"]: s for s in goal.steps}

    def reply(req: RecordedRequest) -> Reply:
        last = str(req.messages[-1].get("content", "")) if req.messages else ""
        if "If the results answer the goal" in last:
            return Text(json.dumps({"answer": f"{goal.name}: done"}))
        if "failed for good" in last:
            return Text(plan_lines(_fixed(by_id[i]) for i in _repair_ids(last) if i in by_id))
        if "REMAINING plan" in last or "is stale" in last:
            done = set(_DONE.findall(last))
            return Text(plan_lines(_fixed(s) for s in goal.steps if s["id"] not in done))
        if "NEXT step" in last:  # the ReAct baseline
            return Text(plan_lines([_fixed(by_id[m]) if "retry" in last else by_id[m]
                                    for m in re.findall(r"next: (\S+)", last)]))
        return Text(plan_lines(goal.steps))

    return reply


def _busy_union(state: RunState) -> float:
    spans = sorted((a[1], a[2]) for rec in [*state.records.values(), *(r for _, r in state.retired)]
                   for a in rec.attempt_log if a[2] is not None)
    total, end = 0.0, -math.inf
    for s, e in spans:
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


@dataclass
class Measured:
    first_call: float
    end_to_end: float
    idle: float
    reexecuted: int
    model_calls: int = 0  # chat completions the system sent for the goal (plan, repairs, re-plans, answer)
    tokens: int = 0  # prompt + completion tokens of those calls


def _clock() -> Clock:
    """The virtual clock on a :class:`VirtualEventLoop` (``run_virtual``: deterministic, seconds of model and tool
    time in milliseconds), else the real one."""
    return VirtualClock() if isinstance(asyncio.get_running_loop(), VirtualEventLoop) else RealClock()


def _now() -> float:
    return asyncio.get_running_loop().time()  # virtual time on the virtual loop, monotonic time otherwise


async def _planweave(goal: Goal, options: PlanningOptions, *, ttft: float, tps: float) -> Measured:
    executions: Counter[str] = Counter()
    tools = _tools(executions)
    server = ScriptedLLM(script_for(goal), ttft=ttft, tokens_per_second=tps)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="bench") as client, \
            open_engine("memory://", tools=tools, clock=_clock()) as engine:
        t0 = _now()
        result: RunResult = await PlanningLoop(engine, client, tools, options=options).run(goal.name)
        elapsed = _now() - t0
    state = result.state
    if result.status != "succeeded":
        raise RuntimeError(f"{goal.name} did not succeed: {result.error}")
    origin = state.created_at or 0.0
    first = min(rec.attempt_log[0][1] for rec in [*state.records.values(), *(r for _, r in state.retired)]
                if rec.attempt_log) - origin
    makespan = (state.finished_at or origin) - origin
    return Measured(first, elapsed, makespan - _busy_union(state), sum(c - 1 for c in executions.values()),
                    len(state.model_calls), state.tokens)


async def _react(goal: Goal, *, ttft: float, tps: float) -> Measured:
    """A sequential ReAct-style loop: ask the model for the next step, run it, observe, repeat."""
    executions: Counter[str] = Counter()
    tools = _tools(executions)
    server = ScriptedLLM(script_for(goal), ttft=ttft, tokens_per_second=tps)
    first = None
    busy = 0.0
    calls = tokens = 0
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="bench") as client:
        from planweave.models import CompletionRequest

        clock = _clock()
        t0 = _now()
        for step in goal.steps:
            prompt = f"Goal: {goal.name}. Observation so far ok. Write the NEXT step. next: {step['id']}"
            for attempt in range(2):
                ask = prompt + (" retry" if attempt else "")
                done = await client.complete(CompletionRequest.of(ask, max_tokens=200))
                calls, tokens = calls + 1, tokens + done.total_tokens
                chosen = json.loads(done.text.strip().splitlines()[0])
                if first is None:
                    first = _now() - t0
                s = _now()
                set_current_step(StepContext("react", step["id"], attempt + 1, clock))
                try:
                    await tools["work"].invoke(chosen["args"])
                    busy += _now() - s
                    break
                except ConnectionError:
                    busy += _now() - s
        done = await client.complete(CompletionRequest.of("If the results answer the goal, say so.", max_tokens=50))
        calls, tokens = calls + 1, tokens + done.total_tokens
        elapsed = _now() - t0
    return Measured(first or 0.0, elapsed, elapsed - busy, sum(c - 1 for c in executions.values()), calls, tokens)


async def measure(goals: Sequence[Goal], *, ttft: float, tps: float) -> dict[str, Any]:
    """Run every system on every goal; return the contract's JSON (sums over goals) plus per-goal detail."""
    systems: dict[str, list[Measured]] = {k: [] for k in
                                          ("streaming", "whole_plan", "synchronous", "react", "global_replan")}
    # JSON Lines in text, as the figures in docs/benchmarks.md were measured; tool-call planning against it:
    # planweave.bench.tool_planning.
    text = PlanningOptions(plan_via="text")
    for goal in goals:
        systems["streaming"].append(await _planweave(goal, text, ttft=ttft, tps=tps))
        systems["whole_plan"].append(await _planweave(goal, replace(text, stream_admission=False), ttft=ttft,
                                                      tps=tps))
        systems["synchronous"].append(await _planweave(goal, replace(text, synchronous=True), ttft=ttft,
                                                       tps=tps))
        systems["global_replan"].append(await _planweave(goal, replace(text, local_repair=False), ttft=ttft,
                                                         tps=tps))
        systems["react"].append(await _react(goal, ttft=ttft, tps=tps))

    def total(name: str, attr: str) -> float:
        return round(float(sum(getattr(m, attr) for m in systems[name])), 3)

    return {
        "first_tool_call_s": {"streaming": total("streaming", "first_call"),
                              "whole_plan": total("whole_plan", "first_call")},
        "end_to_end_s": {"concurrent": total("streaming", "end_to_end"),
                         "synchronous": total("synchronous", "end_to_end"), "react": total("react", "end_to_end")},
        "executor_idle_s": {"concurrent": total("streaming", "idle"), "synchronous": total("synchronous", "idle")},
        "reexecuted_steps": {"local_repair": int(total("streaming", "reexecuted")),
                             "global_replan": int(total("global_replan", "reexecuted"))},
        "goals": [{"name": g.name, "steps": len(g.steps), "flaky": sum(1 for s in g.steps if s["args"].get("flaky"))}
                  for g in goals],
        # Per goal (in the order of "goals") and system: model calls and tokens.
        "model_calls": {name: [m.model_calls for m in runs] for name, runs in systems.items()},
        "model_tokens": {name: [m.tokens for m in runs] for name, runs in systems.items()},
        "model": {"ttft_s": ttft, "tokens_per_s": tps},
        "clock": "virtual" if isinstance(_clock(), VirtualClock) else "real",
        "step_ms_median": sorted(s["args"]["ms"] for g in goals for s in g.steps)[
            sum(len(g.steps) for g in goals) // 2],
    }


@dataclass(frozen=True)
class _Options:
    goals: int
    seed: int
    ttft: float
    tps: float
    step_ms: float
    quick: bool
    json: bool
    virtual: bool


def _options(
    goals: Annotated[int, typer.Option(min=1, help="goals to plan and run")] = 3,
    seed: Annotated[int, typer.Option(help="seed of the goals' random plans")] = 7,
    ttft: Annotated[float, typer.Option(help="the scripted model's time to first token (s)")] = 0.3,
    tps: Annotated[float, typer.Option(help="the scripted model's tokens per second")] = 30.0,
    step_ms: Annotated[float, typer.Option(help="median tool latency (lognormal)")] = 1000.0,
    quick: Annotated[bool, typer.Option("--quick", help="2 goals at 100 tokens/s")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
    virtual: Annotated[bool, typer.Option("--virtual", help="on the virtual clock: model and tool time take no "
                                          "wall time; the same figures on every run")] = False,
) -> _Options:
    """Streaming admission and concurrent re-planning vs whole-plan, synchronous and ReAct, on a scripted model."""
    return _Options(goals, seed, ttft, tps, step_ms, quick, json_output, virtual)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print the table (or ``--json``)."""
    args = parse_command_line(_options, argv, "planweave bench planning")
    goals, tps = ((make_goals(2, args.seed, mean_ms=args.step_ms / 4), 100.0) if args.quick
                  else (make_goals(args.goals, args.seed, mean_ms=args.step_ms), args.tps))
    data = (run_virtual if args.virtual else asyncio.run)(measure(goals, ttft=args.ttft, tps=tps))
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"planning benchmark: {len(goals)} goals ({', '.join(str(g['steps']) for g in data['goals'])} steps; "
          f"{sum(g['flaky'] for g in data['goals'])} flaky), model ttft {args.ttft}s at {tps:g} tokens/s, "
          f"tool latency median {data['step_ms_median']} ms, {data['clock']} clock")
    f, e, i, r = (data[k] for k in ("first_tool_call_s", "end_to_end_s", "executor_idle_s", "reexecuted_steps"))
    rows = [
        ("time to first tool call (s)", f"streaming {f['streaming']}", f"whole plan {f['whole_plan']}",
         f"{f['whole_plan'] / max(f['streaming'], 1e-9):.1f}x"),
        ("end to end (s)", f"concurrent {e['concurrent']}", f"synchronous {e['synchronous']}",
         f"react {e['react']}"),
        ("executor idle (s)", f"concurrent {i['concurrent']}", f"synchronous {i['synchronous']}", ""),
        ("steps re-executed", f"local repair {r['local_repair']}", f"global re-plan {r['global_replan']}", ""),
    ]
    for row in rows:
        print(f"  {row[0]:<30} {row[1]:<22} {row[2]:<24} {row[3]}")
    print(model_calls_table(data))
    return 0


def model_calls_table(data: dict[str, Any]) -> str:
    """Model calls / tokens per goal (rows) and system (columns), with the totals, as aligned text."""
    systems = list(data["model_calls"])
    lines = ["  model calls / tokens per goal", "  " + f"{'goal':<12}" + "".join(f"{s:>18}" for s in systems)]
    cells = {s: list(zip(data["model_calls"][s], data["model_tokens"][s], strict=True)) for s in systems}
    for i, goal in enumerate(data["goals"]):
        label = f"{goal['name']} ({goal['steps']})"
        lines.append("  " + f"{label:<12}" + "".join(f"{f'{c} / {t}':>18}" for c, t in (cells[s][i] for s in systems)))
    totals = ((sum(c for c, _ in cells[s]), sum(t for _, t in cells[s])) for s in systems)
    lines.append("  " + f"{'total':<12}" + "".join(f"{f'{c} / {t}':>18}" for c, t in totals))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
