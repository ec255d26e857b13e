"""Speculative planning in ``planweave bench speculate --planning``: the plain streaming planner against a fast
draft model verified by it (:mod:`planweave.planning.draft`).

Seeded workloads: plans of ``steps`` idempotent tool steps (a seeded duration each, one or two producers referenced
in the arguments of most), written by a slow main planner (time to first token ``main_ttft``, ``main_tps`` tokens/s)
and drafted by a fast model (``draft_ttft``, ``draft_tps``), both served by one scripted OpenAI-compatible server on
loopback, the run on the virtual clock (durations exact, nothing raced). The draft's lines agree with the main
planner's line by line with probability ``p`` each, until the first that does not (the rest of the draft then
diverges), so the accepted prefix is geometric. Per (p, variant): time to the first tool call (the first step's
start, an adopted draft attempt's start counting) and end to end, both from the planner's request (medians over
the seeds), the agreeing prefix, the draft attempts adopted and discarded, the extra model calls and tokens, and
``results_differ``: steps whose output, or runs whose plan or answer, differ from the plain planner's (0 in every
row, or draft planning lost something).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["AGREEMENTS", "draft_of", "render_planning_table", "run_planning_bench", "workload"]

AGREEMENTS = (0.0, 0.3, 0.6, 0.9)
GOAL = "run the seeded workload"
ANSWER = json.dumps({"answer": "done"})


def workload(seed: int, steps: int, tool_scale: float = 1.0, independent: float = 1 / 3) -> list[dict[str, Any]]:
    """A seeded plan of ``work`` steps: each after the first reads one or two earlier steps' outputs, or (with
    probability ``independent``) starts afresh, with a seeded duration of 0.2 to 1.5 s times ``tool_scale``."""
    rng = random.Random(seed)
    plan: list[dict[str, Any]] = []
    for i in range(steps):
        fresh = i == 0 or rng.random() < independent
        parents = [] if fresh else sorted(rng.sample(range(i), k=min(i, rng.choice((1, 2)))))
        args: dict[str, Any] = {"task": f"{seed}.{i}", "seconds": round(rng.uniform(0.2, 1.5) * tool_scale, 2)}
        if parents:
            args["inputs"] = [f"${{s{p}.value}}" for p in parents]
        plan.append({"id": f"s{i}", "tool": "work", "args": args})
    return plan


def draft_of(plan: Sequence[Mapping[str, Any]], p: float, rng: random.Random) -> tuple[list[dict[str, Any]], int]:
    """The draft of ``plan``: each line right with probability ``p`` until the first wrong one, every line after it
    wrong too (another task). Returns the draft and its agreeing prefix."""
    draft: list[dict[str, Any]] = []
    agree = 0
    right = True
    for step in plan:
        right = right and rng.random() < p
        agree += right
        args = dict(step["args"]) if right else {**step["args"], "task": f"draft guess {step['id']}"}
        draft.append({**step, "args": args})
    return draft, agree


async def _one(plan: Sequence[Mapping[str, Any]], draft: Sequence[Mapping[str, Any]] | None,
               settings: Mapping[str, float]) -> dict[str, Any]:
    from planweave import Engine, Toolbox, VirtualClock
    from planweave.journal.memory import MemoryJournal
    from planweave.models.openai import OpenAIChatClient, reset_server_compat
    from planweave.planning import PlanningLoop, PlanningOptions
    from planweave.testing import ScriptedLLM, Text
    from planweave.testing.scripted_llm import RecordedRequest, plan_lines

    clock = VirtualClock()
    calls: list[str] = []

    async def work(task: str, seconds: float, inputs: list[Any] | None = None) -> dict[str, Any]:
        """A step of the workload: its value is a function of its task and inputs."""
        calls.append(task)
        await asyncio.sleep(seconds)
        return {"value": f"{task}<{','.join(map(str, inputs or []))}>"}

    tools = Toolbox()
    tools.add(work, idempotent=True)

    def reply(req: RecordedRequest) -> Text:
        if req.body.get("model") == "draft":
            return Text(plan_lines(draft or []), ttft=settings["draft_ttft"], tokens_per_second=settings["draft_tps"])
        if "If the results answer the goal" in " ".join(str(m.get("content", "")) for m in req.messages):
            return Text(ANSWER, ttft=settings["main_ttft"], tokens_per_second=settings["main_tps"])
        return Text(plan_lines(plan), ttft=settings["main_ttft"], tokens_per_second=settings["main_tps"])

    reset_server_compat()
    server = ScriptedLLM(reply, models=("main", "draft"))
    async with server as base_url, OpenAIChatClient("main", base_url=base_url, api_key="k") as client, \
            OpenAIChatClient("draft", base_url=base_url, api_key="k") as drafter, \
            Engine(MemoryJournal(), tools=tools, clock=clock) as engine:
        started = clock.now()
        options = PlanningOptions(draft=drafter if draft is not None else None)
        result = await PlanningLoop(engine, client, tools, options=options).run(GOAL)
        ended = clock.now()
    if not result.ok:
        raise RuntimeError(f"a planning run failed: {result.error}")
    state = result.state
    first = min(r.started_at for r in state.records.values() if r.started_at is not None)
    drafts = [c for c in state.model_calls if c.get("purpose") == "draft"]
    return {"first_call_s": first - started, "end_to_end_s": ended - started, "outputs": dict(result.outputs),
            "plan": [s.model_dump(mode="json", exclude_defaults=True) for s in state.plan.spec.steps],
            "answer": state.answer, "tool_calls": len(calls),
            "adopted": sum(1 for s in state.speculations if s["outcome"] == "adopted"),
            "discarded": sum(1 for s in state.speculations if s["outcome"].startswith("discarded")),
            "draft_calls": len(drafts),
            "draft_tokens": sum(int(c["prompt_tokens"]) + int(c["completion_tokens"]) for c in drafts)}


async def _bench(seeds: Sequence[int], steps: int, agreements: Sequence[float],
                 settings: Mapping[str, float], tool_scale: float, independent: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in agreements:
        plain_rows: list[dict[str, Any]] = []
        draft_rows: list[dict[str, Any]] = []
        for seed in seeds:
            plan = workload(seed, steps, tool_scale, independent)
            draft, agree = draft_of(plan, p, random.Random(f"{seed}/{p}"))
            plain = await _one(plan, None, settings)
            drafted = await _one(plan, draft, settings)
            differ = sum(1 for sid, out in plain["outputs"].items() if drafted["outputs"].get(sid) != out)
            differ += int(plain["plan"] != drafted["plan"]) + int(plain["answer"] != drafted["answer"])
            plain_rows.append({**plain, "agree": 0, "differ": 0, "saved": 0.0})
            draft_rows.append({**drafted, "agree": agree, "differ": differ,
                               "wasted_calls": drafted["tool_calls"] - plain["tool_calls"],
                               "saved": plain["end_to_end_s"] - drafted["end_to_end_s"]})
        for variant, found in (("plain", plain_rows), ("draft", draft_rows)):
            rows.append({
                "p": p, "variant": variant, "seeds": len(found), "steps": steps,
                "first_call_s": round(statistics.median(f["first_call_s"] for f in found), 3),
                "end_to_end_s": round(statistics.median(f["end_to_end_s"] for f in found), 3),
                "saved_s": round(statistics.fmean(f["saved"] for f in found), 3),
                "agreeing_prefix": sum(f["agree"] for f in found) / len(found),
                "adopted": sum(f["adopted"] for f in found) / len(found),
                "discarded": sum(f["discarded"] for f in found) / len(found),
                "extra_model_calls": sum(f["draft_calls"] for f in found) / len(found),
                "extra_tokens": sum(f["draft_tokens"] for f in found) / len(found),
                "wasted_tool_calls": sum(f.get("wasted_calls", 0) for f in found) / len(found),
                "results_differ": sum(f["differ"] for f in found),
            })
    return rows


def run_planning_bench(seeds: int = 5, steps: int = 8, main_ttft: float = 1.0, main_tps: float = 30.0,
                       draft_ttft: float = 0.1, draft_tps: float = 300.0,
                       agreements: Sequence[float] = AGREEMENTS, tool_scale: float = 1.0,
                       independent: float = 1 / 3) -> dict[str, Any]:
    """Every (p, variant) row as one JSON-ready dict (see the module doc)."""
    from planweave import run_virtual

    settings = {"main_ttft": main_ttft, "main_tps": main_tps, "draft_ttft": draft_ttft, "draft_tps": draft_tps}
    rows = run_virtual(_bench(range(1, seeds + 1), steps, agreements, settings, tool_scale, independent))
    return {"settings": {"seeds": seeds, "steps": steps, **settings, "tool_scale": tool_scale,
                         "independent": round(independent, 3), "clock": "virtual"},
            "rows": rows}


def render_planning_table(result: Mapping[str, Any]) -> str:
    s = result["settings"]
    low, high = 0.2 * s["tool_scale"], 1.5 * s["tool_scale"]
    lines = [f"speculative planning: {s['seeds']} seeded plans of {s['steps']} idempotent tool steps "
             f"({low:g}-{high:g} s, each independent with probability {s['independent']:g}); "
             f"main planner ttft {s['main_ttft']:g} s at {s['main_tps']:g} tokens/s, draft ttft {s['draft_ttft']:g} s "
             f"at {s['draft_tps']:g} tokens/s, virtual clock; medians of seconds from the planner's request, "
             "per-seed means of the rest (saved: end to end, plain minus draft)", "",
             f"{'p':>4} {'variant':<7} {'first call s':>12} {'end to end s':>12} {'saved s':>7} {'prefix':>6} "
             f"{'adopted':>7} "
             f"{'discarded':>9} {'extra calls':>11} {'extra tokens':>12} {'wasted tools':>12} {'results differ':>14}"]
    for r in result["rows"]:
        lines.append(f"{r['p']:>4} {r['variant']:<7} {r['first_call_s']:>12.3f} {r['end_to_end_s']:>12.3f} "
                     f"{r['saved_s']:>7.3f} "
                     f"{r['agreeing_prefix']:>6.1f} {r['adopted']:>7.1f} {r['discarded']:>9.1f} "
                     f"{r['extra_model_calls']:>11.1f} {r['extra_tokens']:>12.0f} {r['wasted_tool_calls']:>12.1f} "
                     f"{r['results_differ']:>14}")
    return "\n".join(lines)
