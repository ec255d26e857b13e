"""``planweave bench admission``: many runs sharing one congested model endpoint, with and without admission control.

The endpoint is the scripted OpenAI-compatible server with its congestion model: up to ``--knee`` calls in flight
it answers at its base speed; past it each call slows by ``(in flight / knee) ** 2`` (throughput falls), and past
``--hard-limit`` it answers HTTP 429 (``Retry-After``) at once. ``--runs`` runs arrive at ``--rate`` runs per
second, each a four-step plan of ``llm`` steps (``a``; then ``b``, on the critical path, and ``c``, with slack; then
``d``), one in ten at priority 1. Every model call goes through the client's admission scheduler in one of these
modes, each on a fresh server in the same process:

* ``fixed``: a fixed semaphore of ``--fixed`` calls, first come first served (a limit set without knowing the knee);
* ``knee``: the same, set by hand to the knee (the best a fixed limit can do, if one knew it);
* ``adaptive``: the AIMD window (from 4, up to ``--fixed``) with priority (run priority, step slack) and aging.

Reported per mode: runs that succeeded, wall time, goodput (successful model calls per second, from the server's
own records), p50/p99 run latency (arrival to end), the 429s the server sent, the p99 admission wait and the final
window; and the ratios of ``adaptive`` to ``fixed``. Speed is printed, never asserted; with ``--virtual`` (the
virtual clock: the server's latency and the arrivals are virtual time, the same figures on every run) the ordering
of goodput is, at a small size, in ``tests/bench/test_admission_orderings.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, cast

import typer

from planweave.bench.cli import parse_command_line
from planweave.core.clock import run_virtual

__all__ = ["ModeResult", "main", "measure_mode"]

Mode = Literal["fixed", "knee", "adaptive"]
MODES: tuple[Mode, ...] = ("fixed", "knee", "adaptive")
REPLY = "The answer is forty-two, as computed."


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    runs: int
    succeeded: int
    wall_s: float
    goodput_calls_s: float
    calls_ok: int
    p50_run_s: float
    p99_run_s: float
    rate_limited: int
    server_errors: int
    p99_wait_s: float
    window: float
    decreases: int


def _plan(i: int) -> dict[str, Any]:
    def llm(sid: str, seconds: float, after: Sequence[str] = ()) -> dict[str, Any]:
        step: dict[str, Any] = {"id": sid, "tool": "llm", "args": {"prompt": f"run {i} step {sid}", "max_tokens": 16},
                                "estimate": {"duration": seconds}, "retries": 4}
        if after:
            step["after"] = list(after)
        return step

    return {"steps": [llm("a", 1), llm("b", 3, ["a"]), llm("c", 1, ["a"]), llm("d", 1, ["b", "c"])]}


def _limits(mode: Mode, fixed: int, knee: int) -> Any:
    from planweave.models.admission import EndpointLimits

    if mode == "fixed":
        return EndpointLimits(max_concurrency=fixed, order="fcfs")
    if mode == "knee":
        return EndpointLimits(max_concurrency=knee, order="fcfs")
    return EndpointLimits(max_concurrency=fixed, adaptive=True, initial_window=4, order="priority")


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure_mode(mode: Mode, *, runs: int, rate: float, knee: int, hard_limit: int, fixed: int,
                       ttft: float, tps: float, seed: int = 7) -> ModeResult:
    """Run the workload once through admission mode ``mode`` against a fresh congested server."""
    from planweave import RealClock, Toolbox, VirtualClock, open_engine
    from planweave.core.clock import VirtualEventLoop
    from planweave.journal.memory import MemoryJournal
    from planweave.models.admission import WAIT_BUCKETS, Admission
    from planweave.models.openai import Backoff, OpenAIChatClient, reset_server_compat
    from planweave.testing import Congestion, ScriptedLLM, Text
    from planweave.tools.llm import llm_tool

    reset_server_compat()
    rng = random.Random(seed)
    server = ScriptedLLM(default=Text(REPLY), ttft=ttft, tokens_per_second=tps, models=("bench",),
                         congestion=Congestion(knee=knee, hard_limit=hard_limit, retry_after=0.5))
    admission = Admission({"bench": _limits(mode, fixed, knee)})
    latencies: list[float] = []
    succeeded = 0
    async with (
        server as base_url,
        OpenAIChatClient("bench", base_url=base_url, admission=admission,
                         backoff=Backoff(attempts=3, base=0.2, cap=2.0), rng=random.Random(seed)) as client,
        open_engine(MemoryJournal(), tools=Toolbox({"llm": llm_tool(client)}), concurrency=None,
                    clock=VirtualClock() if isinstance(asyncio.get_running_loop(), VirtualEventLoop)
                    else RealClock()) as engine,
    ):
        loop = asyncio.get_running_loop()  # virtual time on the virtual loop (run_virtual): the same on every run
        began = loop.time()

        async def one(i: int) -> None:
            nonlocal succeeded
            arrived = loop.time()
            run = await engine.start(_plan(i), run_id=f"r{i}", priority=1.0 if i % 10 == 0 else 0.0)
            result = await run.wait()
            latencies.append(loop.time() - arrived)
            succeeded += result.ok

        async with asyncio.TaskGroup() as tg:
            for i in range(runs):
                tg.create_task(one(i))
                await asyncio.sleep(rng.expovariate(rate))
        wall = loop.time() - began
    [stats] = admission.stats()
    statuses = [c.status for c in server.served]
    ok = statuses.count(200)
    # p99 wait from the histogram: the bucket bound below which 99% of admissions waited.
    target, seen, p99_wait = 0.99 * max(1, stats.admitted), 0, float("inf")
    for bound, count in zip((*WAIT_BUCKETS, float("inf")), stats.wait_buckets, strict=True):
        seen += count
        if seen >= target:
            p99_wait = bound
            break
    return ModeResult(
        mode=mode, runs=runs, succeeded=succeeded, wall_s=wall, goodput_calls_s=ok / wall, calls_ok=ok,
        p50_run_s=statistics.median(latencies), p99_run_s=_quantile(latencies, 0.99),
        rate_limited=statuses.count(429), server_errors=sum(1 for s in statuses if s is not None and s >= 500),
        p99_wait_s=p99_wait, window=stats.window, decreases=stats.decreases,
    )


LABELS = {"fixed": "(a) fixed semaphore {fixed}, FCFS", "knee": "    fixed semaphore {knee} (the knee), FCFS",
          "adaptive": "(b) adaptive window + priority + aging"}


def table(results: Sequence[ModeResult], *, fixed: int, knee: int) -> str:
    """The results as a text table, with the ratios of (b) to (a)."""
    head = (f"{'mode':<40} {'runs ok':>9} {'wall s':>7} {'goodput/s':>9} {'p50 run s':>9} {'p99 run s':>9} "
            f"{'429s':>6} {'p99 wait':>8} {'window':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        label = LABELS[r.mode].format(fixed=fixed, knee=knee)
        lines.append(f"{label:<40} {r.succeeded:>4}/{r.runs:<4} {r.wall_s:>7.1f} {r.goodput_calls_s:>9.1f} "
                     f"{r.p50_run_s:>9.2f} {r.p99_run_s:>9.2f} {r.rate_limited:>6} {r.p99_wait_s:>8.3g} "
                     f"{r.window:>6.1f}")
    by = {r.mode: r for r in results}
    a, b = by.get("fixed"), by.get("adaptive")
    if a is not None and b is not None:
        lines.append(f"{'ratio (b)/(a)':<40} {'':>9} {b.wall_s / a.wall_s:>7.2f} "
                     f"{b.goodput_calls_s / a.goodput_calls_s:>9.2f} {b.p50_run_s / a.p50_run_s:>9.2f} "
                     f"{b.p99_run_s / a.p99_run_s:>9.2f}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Options:
    runs: int
    rate: float
    knee: int
    hard_limit: int
    fixed: int
    ttft: float
    tps: float
    modes: tuple[Mode, ...]
    json: bool
    virtual: bool


def _options(
    runs: Annotated[int, typer.Option(min=1, help="runs (4 model calls each)")] = 500,
    rate: Annotated[float, typer.Option(help="runs arriving per second (above 0)")] = 16.0,
    knee: Annotated[int, typer.Option(min=1, help="calls in flight before the server slows")] = 24,
    hard_limit: Annotated[int, typer.Option(
        min=1, help="calls in flight past which it answers 429 (at least --knee)")] = 48,
    fixed: Annotated[int, typer.Option(min=1, help="the fixed semaphore of mode (a), and (b)'s ceiling")] = 96,
    ttft: Annotated[float, typer.Option(min=0.0, help="the server's base time to first token (s)")] = 0.3,
    tps: Annotated[float, typer.Option(help="the server's base tokens per second (above 0)")] = 100.0,
    modes: Annotated[str, typer.Option(help="comma-separated, of fixed,knee,adaptive")] = "fixed,adaptive",
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    virtual: Annotated[bool, typer.Option("--virtual", help="on the virtual clock: the same figures on every run")
                       ] = False,
) -> _Options:
    """Many runs sharing one congested model endpoint, with and without admission control."""
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODES]
    if bad or not chosen:
        raise typer.BadParameter(f"unknown mode {bad[0] if bad else '(none)'!r}: choose from {', '.join(MODES)}",
                                 param_hint="--modes")
    for flag, value in (("--rate", rate), ("--tps", tps)):
        if not value > 0:
            raise typer.BadParameter(f"{value:g} is not above 0", param_hint=flag)
    if hard_limit < knee:
        raise typer.BadParameter(f"{hard_limit} is below --knee {knee}", param_hint="--hard-limit")
    return _Options(runs, rate, knee, hard_limit, fixed, ttft, tps, tuple(cast("list[Mode]", chosen)), json_output,
                    virtual)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the modes and print the table (or JSON); a bad option exits 2 naming it (SystemExit)."""
    args = parse_command_line(_options, argv, "planweave bench admission")
    modes = args.modes
    results = []
    started = time.perf_counter()
    for mode in modes:
        results.append((run_virtual if args.virtual else asyncio.run)(measure_mode(
            mode, runs=args.runs, rate=args.rate, knee=args.knee, hard_limit=args.hard_limit, fixed=args.fixed,
            ttft=args.ttft, tps=args.tps)))
    if args.json:
        print(json.dumps({"options": asdict(args), "modes": [asdict(r) for r in results],
                          "seconds": time.perf_counter() - started}, indent=2))
    else:
        print(f"{args.runs} runs (4 llm steps each) at {args.rate:g} runs/s over one endpoint: knee {args.knee}, "
              f"429 past {args.hard_limit} in flight, base ttft {args.ttft:g}s, {args.tps:g} tokens/s")
        print(table(results, fixed=args.fixed, knee=args.knee))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
