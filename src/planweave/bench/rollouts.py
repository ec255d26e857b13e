"""``planweave bench rollouts``: synchronous batches against the asynchronous rollout engine at several staleness
bounds, on the scripted model server (real HTTP, real time) with long-tailed episodes and a simulated trainer step.

Episodes are :class:`~planweave.rollouts.toy.Countdown` (a Pareto number of turns, capped), each turn one model call
that takes ``--call-ms``. The trainer takes ``--train-ms`` per batch of ``--batch`` trajectories, ``--steps`` times.
*sync*: generate a batch (all its episodes at once), wait for the slowest, train, repeat. *async k*: one engine with
``--concurrency`` episodes in flight and ``max_staleness = k`` (partial rollouts); the trainer takes batches as they
are ready and calls ``update_policy`` after each step. Reported per mode: trajectories per second, the fraction of
the time the trainer waited for data, the largest staleness delivered and the staleness histogram.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line
from planweave.models.openai import OpenAIChatClient
from planweave.rollouts import RolloutEngine
from planweave.rollouts.toy import Countdown
from planweave.testing import ScriptedLLM, Text

__all__ = ["STALENESS", "main", "run_bench"]

STALENESS = (0, 1, 2, 4)


def _env(cap: int) -> Any:
    return lambda seed: Countdown(seed, cap=cap)


async def _sync(client: OpenAIChatClient, *, batch: int, steps: int, train_s: float, cap: int) -> dict[str, Any]:
    waited, delivered = 0.0, 0
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        async with RolloutEngine(client, _env(cap), episodes=batch, concurrency=batch, seed=step * batch,
                                 max_staleness=0) as rollouts:
            async for got in rollouts.batches(size=batch):
                delivered += len(got)
        waited += time.perf_counter() - t0
        await asyncio.sleep(train_s)  # the trainer's step; generation waits for it
    total = time.perf_counter() - start
    return {"traj_per_s": delivered / total, "trainer_idle_frac": waited / total, "max_staleness_seen": 0,
            "staleness": {"0": delivered}, "seconds": total, "trajectories": delivered}


async def _async(client: OpenAIChatClient, k: int, *, batch: int, steps: int, train_s: float, cap: int,
                 concurrency: int) -> dict[str, Any]:
    waited, delivered = 0.0, 0
    start = time.perf_counter()
    async with RolloutEngine(client, _env(cap), concurrency=concurrency, max_staleness=k,
                             on_stale="partial") as rollouts:
        batches = rollouts.batches(size=batch)
        for _ in range(steps):
            t0 = time.perf_counter()
            got = await anext(batches)
            waited += time.perf_counter() - t0
            delivered += len(got)
            await asyncio.sleep(train_s)
            await rollouts.update_policy()
        await batches.aclose()
        total = time.perf_counter() - start
        stats = rollouts.stats
    seen = max(stats.staleness, default=0)
    return {"traj_per_s": delivered / total, "trainer_idle_frac": waited / total, "max_staleness_seen": seen,
            "staleness": {str(s): n for s, n in sorted(stats.staleness.items())}, "seconds": total,
            "trajectories": delivered, "interrupted": stats.interrupted, "dropped": stats.dropped_in_flight
            + stats.dropped_waiting}


async def _bench(*, batch: int, steps: int, train_s: float, call_s: float, cap: int, concurrency: int,
                 staleness: Sequence[int]) -> dict[str, Any]:
    server = ScriptedLLM(default=Text("ok"), ttft=call_s)
    async with server as url, OpenAIChatClient("scripted", base_url=url, api_key="bench",
                                               concurrency=max(concurrency, batch)) as client:
        result: dict[str, Any] = {"sync": await _sync(client, batch=batch, steps=steps, train_s=train_s, cap=cap)}
        result["async"] = {str(k): await _async(client, k, batch=batch, steps=steps, train_s=train_s, cap=cap,
                                                concurrency=concurrency) for k in staleness}
    base = result["sync"]["traj_per_s"]
    for row in result["async"].values():
        row["speedup_vs_sync"] = row["traj_per_s"] / base
    result["config"] = {"batch": batch, "steps": steps, "train_s": train_s, "call_s": call_s, "max_turns": cap,
                        "concurrency": concurrency}
    return result


def run_bench(*, batch: int = 16, steps: int = 8, train_s: float = 0.1, call_s: float = 0.005, cap: int = 40,
              concurrency: int = 32, staleness: Sequence[int] = STALENESS) -> dict[str, Any]:
    """Run every mode once in this process and return the figures (see the module docstring)."""
    return asyncio.run(_bench(batch=batch, steps=steps, train_s=train_s, call_s=call_s, cap=cap,
                              concurrency=concurrency, staleness=staleness))


def render(result: dict[str, Any]) -> str:
    rows = [("sync", result["sync"])] + [(f"async k={k}", row) for k, row in result["async"].items()]
    lines = [f"{'mode':<12} {'traj/s':>8} {'vs sync':>8} {'idle':>6} {'max stale':>9}  staleness histogram",
             "-" * 72]
    for name, row in rows:
        ratio = row.get("speedup_vs_sync", 1.0)
        lines.append(f"{name:<12} {row['traj_per_s']:>8.1f} {ratio:>7.2f}x {row['trainer_idle_frac']:>6.2f} "
                     f"{row['max_staleness_seen']:>9}  {row['staleness']}")
    return "\n".join(lines)


def _command(
    batch: Annotated[int, typer.Option("--batch", min=1, help="Trajectories per trainer step.")] = 16,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Trainer steps per mode.")] = 8,
    train_ms: Annotated[float, typer.Option("--train-ms", min=0, help="The simulated trainer step.")] = 100.0,
    call_ms: Annotated[float, typer.Option("--call-ms", min=0, help="Each model call's latency.")] = 5.0,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="The cap of the long-tailed lengths.")] = 40,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Episodes in flight (async).")] = 32,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Synchronous batches vs the asynchronous rollout engine (max_staleness 0, 1, 2, 4) on the scripted server."""
    return run_bench(batch=batch, steps=steps, train_s=train_ms / 1000, call_s=call_ms / 1000, cap=max_turns,
                     concurrency=concurrency), json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench rollouts")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
