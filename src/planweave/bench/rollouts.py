"""``planweave bench rollouts``: synchronous batches against the asynchronous rollout engine at several staleness
bounds, on the scripted model server (real HTTP, real time) with long-tailed episodes and a simulated trainer step.

Episodes are :class:`~planweave.rollouts.toy.Countdown` (a Pareto number of turns, capped), each turn one model call
that takes ``--call-ms``. The trainer takes ``--train-ms`` per batch of ``--batch`` trajectories, ``--steps`` times.
*sync*: generate a batch (all its episodes at once), wait for the slowest, train, repeat. *async k*: one engine with
``--concurrency`` episodes in flight and ``max_staleness = k`` (partial rollouts); the trainer takes batches as they
are ready and calls ``update_policy`` after each step. Reported per mode: trajectories per second, the fraction of
the time the trainer waited for data, the largest staleness delivered and the staleness histogram.

``--goal``: the episodes are planweave goal runs through the rollout gateway (:mod:`planweave.rollouts.goals`) on
the toy vLLM-dialect policy server (byte-level token ids, ``--call-ms`` per call): the planner writes a chain of a
long-tailed number of ``llm`` steps (a Pareto draw capped at ``--max-steps``), each step one call, then the joiner
answers; the figures add tokens per second (prompt and completion ids delivered in samples) and calls per second.
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

__all__ = ["GOAL_STALENESS", "STALENESS", "main", "run_bench", "run_goal_bench"]

STALENESS = (0, 1, 2, 4)
GOAL_STALENESS = (0, 1, 2)


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


# -- goal-run episodes through the gateway ---------------------------------------------------------------------------
def _chain_replies(cap: int) -> Any:
    """The toy policy's answers: a plan of a Pareto number (1..cap) of chained ``llm`` steps, drawn from the
    episode number the goal names; a short word per step; the joiner's answer."""
    import re

    from planweave.rollouts.toy import pareto_length
    from planweave.rollouts.toy_policy import goal_replies, purpose_of

    words = goal_replies(1)

    def reply(messages: Sequence[Any], rng: Any) -> str:
        if purpose_of(messages) != "plan":
            return str(words(messages, rng))
        text = " ".join(str(m.get("content")) for m in messages)
        found = re.search(r"episode (\d+)", text)
        n = pareto_length(int(found.group(1)) if found else 0, cap=cap)
        return "".join(json.dumps({"id": f"s{i}", "tool": "llm", "args": {"prompt": f"Word {i}?", "max_tokens": 8},
                                   **({"after": [f"s{i - 1}"]} if i else {})}) + "\n" for i in range(n))

    return reply


def _goal_row(delivered: list[Any], waited: float, total: float, staleness: dict[int, int]) -> dict[str, Any]:
    samples = [s for t in delivered for s in t.samples]
    return {"traj_per_s": len(delivered) / total, "tokens_per_s": sum(s.tokens for s in samples) / total,
            "completion_tokens_per_s": sum(len(s.completion_token_ids or ()) for s in samples) / total,
            "calls_per_s": len(samples) / total, "trainer_idle_frac": waited / total,
            "max_staleness_seen": max(staleness, default=0),
            "staleness": {str(k): n for k, n in sorted(staleness.items())}, "seconds": total,
            "trajectories": len(delivered), "samples": len(samples),
            "trainable_samples": sum(s.trainable for s in samples)}


async def _goal_bench(*, batch: int, steps: int, train_s: float, call_s: float, cap: int, concurrency: int,
                      staleness: Sequence[int]) -> dict[str, Any]:
    from planweave.api import open_engine
    from planweave.rollouts.gateway import Gateway
    from planweave.rollouts.goals import EpisodeSpec, GoalRollouts
    from planweave.rollouts.toy_policy import ToyPolicyServer

    def episode(seed: int) -> EpisodeSpec:
        return EpisodeSpec(goal=f"Say a word per step (episode {seed}).", budget_tokens=10_000_000, deadline=300)

    toy = ToyPolicyServer(_chain_replies(cap), delay=call_s, version_header=True)
    result: dict[str, Any] = {}
    async with toy.serve() as upstream, Gateway(upstream) as gateway, open_engine("memory://") as engine:
        delivered: list[Any] = []
        waited, start = 0.0, time.perf_counter()
        for step in range(steps):  # sync: a batch of episodes at once, wait for the slowest, train, repeat
            t0 = time.perf_counter()
            async with GoalRollouts(gateway, engine, episodes_from=episode, episodes=batch, concurrency=batch,
                                    seed=step * batch, max_staleness=0) as rollouts:
                async for got in rollouts.batches(size=batch):
                    delivered += list(got)
            waited += time.perf_counter() - t0
            await asyncio.sleep(train_s)
        result["sync"] = _goal_row(delivered, waited, time.perf_counter() - start, {0: len(delivered)})
        result["async"] = {}
        for k in staleness:
            delivered, waited, start = [], 0.0, time.perf_counter()
            toy.version = 0
            async with GoalRollouts(gateway, engine, episodes_from=episode, concurrency=concurrency,
                                    max_staleness=k, on_stale="partial", seed=10_000 * (k + 1)) as rollouts:
                batches = rollouts.batches(size=batch)
                for _ in range(steps):
                    t0 = time.perf_counter()
                    got = await anext(batches)
                    waited += time.perf_counter() - t0
                    delivered += list(got)
                    await asyncio.sleep(train_s)
                    toy.version = await rollouts.update_policy()
                await batches.aclose()
                row = _goal_row(delivered, waited, time.perf_counter() - start, rollouts.stats.staleness)
                row["interrupted"], row["resampled_calls"] = rollouts.stats.interrupted, rollouts.resampled
                row["dropped"] = rollouts.stats.dropped_in_flight + rollouts.stats.dropped_waiting
            result["async"][str(k)] = row
    base = result["sync"]["traj_per_s"]
    for row in result["async"].values():
        row["speedup_vs_sync"] = row["traj_per_s"] / base
    result["config"] = {"episodes": "goal runs", "batch": batch, "steps": steps, "train_s": train_s,
                        "call_s": call_s, "max_steps": cap, "concurrency": concurrency}
    return result


def run_goal_bench(*, batch: int = 8, steps: int = 6, train_s: float = 0.1, call_s: float = 0.02, cap: int = 8,
                   concurrency: int = 16, staleness: Sequence[int] = GOAL_STALENESS) -> dict[str, Any]:
    """Run the goal-run modes once in this process and return the figures (see the module docstring)."""
    return asyncio.run(_goal_bench(batch=batch, steps=steps, train_s=train_s, call_s=call_s, cap=cap,
                                   concurrency=concurrency, staleness=staleness))


def render(result: dict[str, Any]) -> str:
    rows = [("sync", result["sync"])] + [(f"async k={k}", row) for k, row in result["async"].items()]
    goal = "tokens_per_s" in result["sync"]
    extra = f" {'tokens/s':>9} {'calls/s':>8}" if goal else ""
    lines = [f"{'mode':<12} {'traj/s':>8}{extra} {'vs sync':>8} {'idle':>6} {'max stale':>9}  staleness histogram",
             "-" * (72 + len(extra))]
    for name, row in rows:
        ratio = row.get("speedup_vs_sync", 1.0)
        cells = f" {row['tokens_per_s']:>9.0f} {row['calls_per_s']:>8.1f}" if goal else ""
        lines.append(f"{name:<12} {row['traj_per_s']:>8.1f}{cells} {ratio:>7.2f}x {row['trainer_idle_frac']:>6.2f} "
                     f"{row['max_staleness_seen']:>9}  {row['staleness']}")
    return "\n".join(lines)


def _command(
    batch: Annotated[int, typer.Option("--batch", min=1, help="Trajectories per trainer step.")] = 16,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Trainer steps per mode.")] = 8,
    train_ms: Annotated[float, typer.Option("--train-ms", min=0, help="The simulated trainer step.")] = 100.0,
    call_ms: Annotated[float, typer.Option("--call-ms", min=0, help="Each model call's latency.")] = 5.0,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="The cap of the long-tailed lengths.")] = 40,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Episodes in flight (async).")] = 32,
    goal: Annotated[bool, typer.Option("--goal", help="Goal-run episodes through the gateway (max_staleness 0, 1, "
                                       "2; --max-turns caps the steps of a plan).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Synchronous batches vs the asynchronous rollout engine (max_staleness 0, 1, 2, 4) on the scripted server."""
    if goal:
        return run_goal_bench(batch=batch, steps=steps, train_s=train_ms / 1000, call_s=call_ms / 1000,
                              cap=max_turns, concurrency=concurrency), json_output
    return run_bench(batch=batch, steps=steps, train_s=train_ms / 1000, call_s=call_ms / 1000, cap=max_turns,
                     concurrency=concurrency), json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench rollouts")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
