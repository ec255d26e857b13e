"""The speculation benchmark (``planweave bench speculate``): what starting steps on predicted inputs saves, what it
costs, and that it changes no result.

Seeded workloads: DAGs of ``llm`` steps, each prompt built from its producers' replies, served by the scripted
OpenAI-compatible server (:class:`~planweave.testing.ScriptedLLM`, a reply that is a function of the prompt, a set
time to first token and token rate) through the real ``OpenAIChatClient`` and ``llm`` tool, on the real clock (or,
``virtual=True`` / ``--virtual``, the virtual one: the same figures on every run, ``tests/bench/`` asserts them). Every
step carries a ``predict:`` of its reply text, right with probability ``p``. Each workload runs with speculation
off, ``safe`` and ``eager``; per (p, mode): end-to-end latency (median over the seeds), model calls and cost beyond
the run without speculation, speculative attempts started, adopted and discarded, and ``results_differ``: the steps
whose output differs from the run without speculation (0 in every row, or speculation lost something).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line
from planweave.core.clock import run_virtual
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.core.plan.model import SpeculationMode, SpeculationSpec
from planweave.core.plan.refs import render

__all__ = ["main", "run_bench"]

MODEL = "gpt-4o-mini"  # priced in the built-in table, so calls cost what they would
ACCURACIES = (0.0, 0.3, 0.6, 0.9)
MODES: tuple[SpeculationMode, ...] = ("off", "safe", "eager")


def reply_to(prompt: str) -> str:
    """The scripted model's answer: a function of the prompt alone (so a run's results are a function of its plan)."""
    return "answer " + hashlib.sha256(prompt.encode()).hexdigest()[:16]


def workload(seed: int, steps: int) -> dict[str, Any]:
    """A seeded DAG of ``llm`` steps: each step reads one or two earlier steps' replies (about half start chains
    afresh from the first steps), so the plan has depth to hide and width to fill spare slots."""
    rng = random.Random(seed)
    plan: list[dict[str, Any]] = []
    for i in range(steps):
        parents = sorted(rng.sample(range(i), k=min(i, rng.choice((1, 1, 2))))) if i else []
        inputs = " | ".join(f"${{s{p}.text}}" for p in parents)
        plan.append({"id": f"s{i}", "tool": "llm",
                     "args": {"prompt": f"task {seed}.{i}: {inputs}" if inputs else f"task {seed}.{i}",
                              "max_tokens": 32}})
    return {"steps": plan}


def true_replies(doc: Mapping[str, Any]) -> dict[str, str]:
    """Every step's reply text, computed without the engine."""
    plan = validate_plan(parse_plan_document(doc, "bench"))
    outputs: dict[str, Any] = {}
    for sid in plan.order:
        prompt = render(plan.templates[sid], outputs)["prompt"]
        outputs[sid] = {"text": reply_to(prompt)}
    return {sid: out["text"] for sid, out in outputs.items()}


def with_predictions(doc: Mapping[str, Any], p: float, seed: int) -> dict[str, Any]:
    """``doc`` with a ``predict:`` on every step: its reply text with probability ``p``, else a wrong one."""
    truth = true_replies(doc)
    rng = random.Random(f"{seed}/{p}")
    steps = []
    for step in doc["steps"]:
        right = rng.random() < p
        steps.append({**step, "predict": {"text": truth[step["id"]] if right else f"a wrong guess for {step['id']}"}})
    return {"steps": steps}


def policy(mode: SpeculationMode, max_parallel: int, max_extra_cost_usd: float) -> SpeculationSpec:
    """The policy of a row: ``mode`` with the benchmark's limits."""
    return SpeculationSpec(mode=mode, max_parallel=max_parallel, min_confidence=0.5,
                           max_extra_cost_usd=max_extra_cost_usd)


async def _one(doc: Mapping[str, Any], mode: SpeculationMode, *, concurrency: int, ttft: float, tps: float,
               max_parallel: int, max_extra_cost_usd: float) -> dict[str, Any]:
    """One run of ``doc`` against a fresh scripted server: wall seconds, outputs, calls, cost, speculation."""
    from planweave import RealClock, Toolbox, VirtualClock, open_engine
    from planweave.core.clock import VirtualEventLoop
    from planweave.journal.memory import MemoryJournal
    from planweave.models.openai import OpenAIChatClient, reset_server_compat
    from planweave.testing import ScriptedLLM, Text
    from planweave.testing.scripted_llm import RecordedRequest
    from planweave.tools.llm import llm_tool

    def answer(req: RecordedRequest) -> Text:
        return Text(reply_to(str(req.messages[-1]["content"])))

    reset_server_compat()
    loop = asyncio.get_running_loop()
    clock = VirtualClock() if isinstance(loop, VirtualEventLoop) else RealClock()
    server = ScriptedLLM(answer, ttft=ttft, tokens_per_second=tps, models=(MODEL,))
    async with (
        server as base_url,
        OpenAIChatClient(MODEL, base_url=base_url, concurrency=None) as client,
        open_engine(MemoryJournal(), tools=Toolbox({"llm": llm_tool(client)}), concurrency=concurrency,
                    clock=clock) as engine,
    ):
        started = loop.time()  # virtual seconds on the virtual loop
        run = await engine.start(doc, run_id="bench", speculation=policy(mode, max_parallel, max_extra_cost_usd))
        result = await run.wait()
        wall = loop.time() - started
    if not result.ok:
        raise RuntimeError(f"the {mode} run failed: {result.error}")
    spec = result.summary.get("speculation") or {}
    return {"wall_s": wall, "outputs": dict(result.outputs), "calls": len(server.served),
            "cost_usd": float(result.summary["cost_usd"]), "started": spec.get("started", 0),
            "adopted": spec.get("adopted", 0), "discarded": spec.get("discarded", 0),
            "extra_cost_usd": spec.get("extra_cost_usd", 0.0)}


async def _bench(seeds: Sequence[int], steps: int, accuracies: Sequence[float], concurrency: int, ttft: float,
                 tps: float, max_parallel: int, max_extra_cost_usd: float) -> list[dict[str, Any]]:
    cells: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for p in accuracies:
        for seed in seeds:
            doc = with_predictions(workload(seed, steps), p, seed)
            runs = {mode: await _one(doc, mode, concurrency=concurrency, ttft=ttft, tps=tps,
                                     max_parallel=max_parallel, max_extra_cost_usd=max_extra_cost_usd)
                    for mode in MODES}
            off = runs["off"]
            for mode, measured in runs.items():
                differ = sum(1 for sid, out in off["outputs"].items() if measured["outputs"].get(sid) != out)
                cells.setdefault((p, mode), []).append({
                    **measured, "results_differ": differ, "vs_off": measured["wall_s"] / off["wall_s"],
                    "extra_calls": measured["calls"] - off["calls"],
                    "extra_cost": measured["cost_usd"] - off["cost_usd"]})
    rows: list[dict[str, Any]] = []
    for (p, row_mode), found in cells.items():
        rows.append({
            "p": p, "mode": row_mode, "seeds": len(found), "steps": steps,
            "latency_s": round(statistics.median(f["wall_s"] for f in found), 3),
            "vs_off": round(statistics.median(f["vs_off"] for f in found), 3),
            "extra_calls": sum(f["extra_calls"] for f in found) / len(found),
            "extra_cost_usd": round(sum(f["extra_cost"] for f in found) / len(found), 8),
            "started": sum(f["started"] for f in found) / len(found),
            "adopted": sum(f["adopted"] for f in found) / len(found),
            "discarded": sum(f["discarded"] for f in found) / len(found),
            "results_differ": sum(f["results_differ"] for f in found),
        })
    return rows


def run_bench(seeds: int = 3, steps: int = 12, concurrency: int = 4, ttft: float = 0.15, tps: float = 200.0,
              max_parallel: int = 4, max_extra_cost_usd: float = 0.01,
              accuracies: Sequence[float] = ACCURACIES, virtual: bool = False) -> dict[str, Any]:
    """Every (p, mode) row as one JSON-ready dict (see the module doc); ``virtual``: on the virtual clock."""
    rows = (run_virtual if virtual else asyncio.run)(_bench(range(1, seeds + 1), steps, accuracies, concurrency,
                                                            ttft, tps, max_parallel, max_extra_cost_usd))
    return {"settings": {"seeds": seeds, "steps": steps, "concurrency": concurrency, "ttft_s": ttft,
                         "tokens_per_second": tps, "max_parallel": max_parallel,
                         "max_extra_cost_usd": max_extra_cost_usd, "model": MODEL,
                         "clock": "virtual" if virtual else "real"},
            "rows": rows}


def render_table(result: Mapping[str, Any]) -> str:
    s = result["settings"]
    lines = [f"speculation: {s['seeds']} seeded DAGs of {s['steps']} llm steps on the scripted server "
             f"(time to first token {s['ttft_s']:g} s, {s['tokens_per_second']:g} tokens/s, model {s['model']}), "
             f"concurrency {s['concurrency']}, max_parallel {s['max_parallel']}, max_extra_cost_usd "
             f"{s['max_extra_cost_usd']:g}; per-seed means, latency the median", "",
             f"{'p':>4} {'mode':<6} {'latency s':>9} {'vs off':>7} {'extra calls':>11} {'extra USD':>10} "
             f"{'started':>7} {'adopted':>7} {'discarded':>9} {'results differ':>14}"]
    for r in result["rows"]:
        lines.append(f"{r['p']:>4} {r['mode']:<6} {r['latency_s']:>9.3f} {r['vs_off']:>7.3f} "
                     f"{r['extra_calls']:>11.1f} {r['extra_cost_usd']:>10.6f} {r['started']:>7.1f} "
                     f"{r['adopted']:>7.1f} {r['discarded']:>9.1f} {r['results_differ']:>14}")
    return "\n".join(lines)


def _command(
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeded workloads per accuracy.")] = 3,
    steps: Annotated[int, typer.Option("--steps", min=2, help="llm steps per workload.")] = 12,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="The engine's concurrency.")] = 4,
    ttft: Annotated[float, typer.Option("--ttft", min=0, help="The scripted server's time to first token, s.")
                    ] = 0.15,
    tps: Annotated[float, typer.Option("--tps", min=1, help="The scripted server's tokens per second.")] = 200.0,
    max_parallel: Annotated[int, typer.Option("--max-parallel", min=1,
                                              help="speculation.max_parallel of safe and eager.")] = 4,
    max_extra_cost_usd: Annotated[float, typer.Option("--max-extra-cost-usd", min=0,
                                                      help="speculation.max_extra_cost_usd.")] = 0.01,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object (rows with results_differ).")
                           ] = False,
    planning: Annotated[bool, typer.Option(
        "--planning", help="Speculative planning instead: the plain streaming planner vs a fast draft model "
                           "verified by it (planweave.bench.draft_planning; --seeds, --steps apply).")] = False,
    tool_scale: Annotated[float, typer.Option("--tool-scale", min=0.01,
                                              help="--planning: the tool steps' durations (0.2-1.5 s) times this.")
                          ] = 1.0,
    independent: Annotated[float, typer.Option("--independent", min=0, max=1,
                                               help="--planning: how often a step reads no earlier step's output.")
                           ] = 1 / 3,
    virtual: Annotated[bool, typer.Option("--virtual", help="On the virtual clock: the same latencies on every run.")
                       ] = False,
) -> tuple[dict[str, Any], bool]:
    """Speculation off, safe and eager on seeded llm DAGs whose predictions are right with p in {0, 0.3, 0.6, 0.9}."""
    if planning:
        from planweave.bench.draft_planning import run_planning_bench

        return {"planning": run_planning_bench(seeds=seeds, steps=steps, tool_scale=tool_scale,
                                                  independent=independent)}, json_output
    return run_bench(seeds, steps, concurrency, ttft, tps, max_parallel, max_extra_cost_usd, virtual=virtual), \
        json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options, 1 if a result differed."""
    result, as_json = parse_command_line(_command, argv, "planweave bench speculate")
    if "planning" in result:
        from planweave.bench.draft_planning import render_planning_table

        print(json.dumps(result, indent=2) if as_json else render_planning_table(result["planning"]))
        return 1 if any(r["results_differ"] for r in result["planning"]["rows"]) else 0
    print(json.dumps(result, indent=2) if as_json else render_table(result))
    return 1 if any(r["results_differ"] for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
