"""Cascade figures for docs/allocation.md: a chain of ``llm`` steps against the scripted model server, on the
virtual clock, with per-model quality and latency; always the small tier, always the large one, and a cascade
(``model: cascade``: small first, escalated when the milestone monitor sees a failed schema check).

For each policy: the fraction of runs that completed, of steps that succeeded (each with 2 retries; a step that
fails for good skips the rest of the chain), the dollars the calls cost (from the
price table and the server's token counts), the virtual makespan, and the calls per tier. Plus the wall cost of the
cascade's bookkeeping per attempt (monitors and cascade, pure), against the pure tool call it wraps.

    .venv/bin/python benchmarks/cascade_bench.py [--steps 30] [--seeds 5]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from typing import Annotated, Any

import typer

from planweave import Toolbox, VirtualClock, open_engine, run_virtual
from planweave.allocate import TierProfile, TierTable
from planweave.allocate.cascade import Cascade
from planweave.allocate.cascade_seam import CascadeSeam
from planweave.allocate.monitors import LowConfidenceMonitor, MilestoneMonitor, MonitorSet, Signal, StuckMonitor
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.models.pricing import Price, PriceTable
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.tools.llm import llm_tool

# per model: P(a right answer), seconds to answer, $/M tokens in and out
MODELS = {"m-small": (0.40, 1.0, 0.1, 0.4), "m-medium": (0.75, 3.0, 1.0, 4.0), "m-large": (0.97, 8.0, 10.0, 40.0)}
PRICES = PriceTable({m: Price(input=i, output=o) for m, (_, _, i, o) in MODELS.items()})
TIERS = TierTable({
    "small": TierProfile("small", "m-small", p_success=0.4, duration_s=1.0, cost_usd=0.00001),
    "medium": TierProfile("medium", "m-medium", p_success=0.75, duration_s=3.0, cost_usd=0.0001),
    "large": TierProfile("large", "m-large", p_success=0.97, duration_s=8.0, cost_usd=0.001),
})
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
POLICIES = {"always small": "m-small", "always large": "m-large", "cascade": "cascade"}


def script_for(seed: int) -> Any:
    """Answers keyed by (seed, prompt, model, how many times that model was asked it): runs replay."""
    asked: Counter[tuple[str, str]] = Counter()

    async def script(request: RecordedRequest) -> Reply:
        model, prompt = str(request.body["model"]), str(request.messages[-1]["content"])
        asked[(prompt, model)] += 1
        p_right, seconds, _, _ = MODELS[model]
        luck = random.Random(f"{seed}|{prompt}|{model}|{asked[(prompt, model)]}").random()  # str seeds: sha512
        await asyncio.sleep(seconds)
        text = '{"answer": "right"}' if luck < p_right else '{"wrong": true}'
        return Text(text, prompt_tokens=200, completion_tokens=50)

    return script


async def one(policy: str, steps: int, seed: int) -> dict[str, Any]:
    async with ScriptedLLM(script_for(seed)) as url, OpenAIChatClient(
            "m-small", base_url=url, api_key="k", prices=PRICES, backoff=Backoff(attempts=1, base=0.01, cap=0.02)
    ) as client:
        seam = CascadeSeam(TIERS)
        tools = Toolbox({"llm": llm_tool(client, prices=PRICES, cascade=seam)})
        plan = {"on_failure": "continue", "steps": [
            {"id": f"s{i}", "tool": "llm", "retries": {"max": 2, "backoff": 0.5},
             **({"after": [f"s{i - 1}"]} if i else {}),
             "args": {"prompt": f"question {i}", "model": POLICIES[policy], "schema": SCHEMA, "max_tokens": 60}}
            for i in range(steps)]}
        async with open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
            seam.bind(engine)
            loop = asyncio.get_running_loop()
            started = loop.time()
            run = await engine.start(plan)
            await run.wait()
            makespan = loop.time() - started
            events = list(await engine.journal.read(run.id))
    ok = sum(1 for e in events if e.kind == "step_succeeded")
    calls = [e for e in events if e.kind == "model_call"]
    return {"ok": ok / steps, "usd": sum(e.data.get("cost_usd", 0.0) for e in calls), "makespan": makespan,
            "calls": Counter(str(e.data.get("model")) for e in calls),
            "escalations": sum(1 for e in events if e.kind == "escalation" and e.data.get("rung") == "escalate"),
            "deescalations": sum(1 for e in events if e.kind == "escalation" and e.data.get("rung") == "deescalate")}


def bookkeeping_us(n: int = 20000) -> float:
    """Microseconds of pure monitor and cascade work per attempt (started, confidence, succeeded or a fire)."""
    cascade = Cascade(("small", "medium", "large"))
    monitors = MonitorSet([StuckMonitor(), MilestoneMonitor(), LowConfidenceMonitor(0.5)])
    t0 = time.perf_counter()
    for i in range(n):
        monitors.observe(Signal("started", float(i)))
        monitors.observe(Signal("action", float(i), key=str(i)))
        fire = monitors.observe(Signal("confidence", float(i), value=0.3 if i % 5 == 0 else 0.9))
        if fire is not None:
            cascade.fired("s", fire)
        else:
            monitors.observe(Signal("succeeded", float(i)))
            cascade.succeeded("s")
    return (time.perf_counter() - t0) / n * 1e6


def main(steps: Annotated[int, typer.Option(help="llm steps in the chain")] = 30,
         seeds: Annotated[int, typer.Option(help="seeded repetitions per policy")] = 5) -> None:
    rows = {}
    for policy in POLICIES:
        results = [run_virtual(one(policy, steps, seed)) for seed in range(seeds)]
        calls: Counter[str] = Counter()
        for r in results:
            calls.update(r["calls"])
        rows[policy] = {
            "ok": statistics.mean(r["ok"] for r in results),
            "runs": statistics.mean(1.0 if r["ok"] == 1.0 else 0.0 for r in results),
            "usd": statistics.mean(r["usd"] for r in results),
            "makespan": statistics.mean(r["makespan"] for r in results),
            "calls": {m: round(c / seeds, 1) for m, c in sorted(calls.items())},
            "up": statistics.mean(r["escalations"] for r in results),
            "down": statistics.mean(r["deescalations"] for r in results),
        }
    large = rows["always large"]
    print(f"{steps} chained llm steps, 2 retries each, {seeds} seeds; ratios against always large")
    print(f"{'policy':<14}{'runs ok':>9}{'steps ok':>10}{'USD':>12}{'x large':>9}{'makespan s':>12}{'x large':>9}"
          f"{'up':>6}{'down':>6}  calls per model")
    for policy, r in rows.items():
        print(f"{policy:<14}{r['runs']:>9.0%}{r['ok']:>10.1%}{r['usd']:>12.6f}{r['usd'] / large['usd']:>9.2f}"
              f"{r['makespan']:>12.1f}{r['makespan'] / large['makespan']:>9.2f}{r['up']:>6.1f}{r['down']:>6.1f}  "
              f"{r['calls']}")
    print(f"cascade bookkeeping per attempt (pure monitors + cascade): {bookkeeping_us():.2f} us")


if __name__ == "__main__":
    typer.run(main)
