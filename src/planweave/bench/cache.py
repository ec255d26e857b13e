"""The result-cache benchmark (``planweave bench cache``): what reuse saves and what a miss costs, on SQLite (and
PostgreSQL with ``--postgres URL``).

Two tables per journal, every figure measured in this process on the real clock, SQLite in a temporary directory:

- **reuse**: a chain of ``--steps`` cacheable steps, each a tool sleeping ``--step-ms``, run once to fill the cache,
  then again with the cache on (every step a hit) and with it off (``Engine(cache=False)``, as ``--no-cache``):
  wall time and real tool calls of each second run, and their ratio.
- **overhead**: a chain and a fan-out of ``--overhead-steps`` steps of a tool that returns at once, each step with
  its own arguments (so every lookup misses): a tool that is not cacheable (no key, no index, no lookup), a
  cacheable one with the cache off (key and index row) and with it on (key, index row and a miss lookup); µs per
  step, the median of ``--repeats``. Plus the run's hook on a step that is not cacheable, timed alone (ns per
  attempt), with and without a tool in the catalog declaring cache.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line
from planweave.core.plan.graph import validate_plan
from planweave.core.plan.model import PlanSpec
from planweave.core.state import RunState
from planweave.engine.cache import StepCache
from planweave.engine.runtime import Engine
from planweave.journal import open_journal
from planweave.journal.memory import MemoryJournal
from planweave.tools.registry import Toolbox

__all__ = ["main", "run_bench"]


def _toolbox(calls: list[int]) -> Toolbox:
    box = Toolbox()

    async def slow(x: int, ms: float) -> dict[str, int]:
        """Sleep ``ms`` milliseconds, return x + 1."""
        calls[0] += 1
        await asyncio.sleep(ms / 1000)
        return {"y": x + 1}

    async def quick(x: int) -> int:
        """Return x at once (cacheable)."""
        calls[0] += 1
        return x

    async def plain(x: int) -> int:
        """Return x at once (idempotent, not cacheable)."""
        calls[0] += 1
        return x

    box.add(slow, idempotent=True, cache=True)
    box.add(quick, idempotent=True, cache=True)
    box.add(plain, idempotent=True)
    return box


def _chain(tool: str, n: int, **args: Any) -> dict[str, Any]:
    steps = [{"id": "s0", "tool": tool, "args": {"x": 0, **args}}]
    steps += [{"id": f"s{i}", "tool": tool, "args": {"x": f"${{s{i - 1}.y}}" if tool == "slow" else i, **args},
               "after": [f"s{i - 1}"]} for i in range(1, n)]
    return {"steps": steps}


def _fan(tool: str, n: int, offset: int) -> dict[str, Any]:
    return {"steps": [{"id": f"s{i}", "tool": tool, "args": {"x": offset + i}} for i in range(n)]}


async def _timed(url: str, doc: Mapping[str, Any], *, cache: bool) -> tuple[float, int, bool]:
    """Seconds a run of ``doc`` takes in a fresh engine on the journal at ``url``, its real tool calls, success."""
    calls = [0]
    async with open_journal(url) as journal, Engine(journal, tools=_toolbox(calls), cache=cache,
                                                    concurrency=None) as engine:
        started = time.perf_counter()
        result = await (await engine.start(doc)).wait()
        await journal.flush()
        return time.perf_counter() - started, calls[0], result.ok


async def _reuse(url: str, steps: int, step_ms: float) -> dict[str, Any]:
    doc = _chain("slow", steps, ms=step_ms)
    first = await _timed(url, doc, cache=True)
    hit = await _timed(url, doc, cache=True)
    off = await _timed(url, doc, cache=False)
    return {"steps": steps, "step_ms": step_ms, "first_s": round(first[0], 4),
            "second_cached_s": round(hit[0], 4), "second_cached_calls": hit[1],
            "second_no_cache_s": round(off[0], 4), "second_no_cache_calls": off[1],
            "speedup": round(off[0] / hit[0], 1) if hit[0] else None,
            "ok": first[2] and hit[2] and off[2]}


async def _overhead(urls: Callable[[str], str], n: int, repeats: int) -> list[dict[str, Any]]:
    cases = [(shape, label, tool, cache) for shape in ("chain", "fan-out")
             for label, tool, cache in (("not cacheable", "plain", True), ("cacheable, cache off", "quick", False),
                                        ("cacheable, miss lookups", "quick", True))]
    samples: dict[tuple[str, str], list[float]] = {}
    offset = 0
    # One warm-up run, then the cases round-robin: load on the machine drifts, and it must hit every case alike.
    for r in range(-1, repeats):
        for shape, label, tool, cache in cases:
            offset += n  # fresh arguments: every lookup misses
            doc = _chain(tool, n) if shape == "chain" else _fan(tool, n, offset)
            if shape == "chain":
                for i, step in enumerate(doc["steps"]):
                    step["args"]["x"] = offset + i
            seconds, _, ok = await _timed(urls(f"overhead-{shape}-{tool}-{cache}-{r}"), doc, cache=cache)
            if not ok:
                raise RuntimeError(f"the {shape} run of {label} did not succeed")
            if r >= 0:
                samples.setdefault((shape, label), []).append(seconds / n * 1e6)
    rows: list[dict[str, Any]] = []
    for (shape, label), found in samples.items():
        base = statistics.median(samples[(shape, "not cacheable")])
        base_min = min(samples[(shape, "not cacheable")])
        median = statistics.median(found)
        rows.append({"shape": shape, "steps": n, "case": label, "us_per_step": round(median, 1),
                     "vs_not_cacheable": round(median / base, 3) if base else None,
                     # the fastest run: what the step costs with the least interference from other load
                     "us_per_step_min": round(min(found), 1),
                     "min_vs_not_cacheable": round(min(found) / base_min, 3) if base_min else None})
    return rows


def _hook_ns() -> dict[str, float]:
    """ns per attempt of the run's cache hook (the expression ``Attempts._execute`` evaluates) on a step that is not
    cacheable: in a run whose tools declare no cache (every plan without cache), and in one whose tools do."""
    tools = _toolbox([0])
    plan = validate_plan(PlanSpec.model_validate(_fan("plain", 1, 0)), tools)
    rec = RunState("bench", plan, ()).records["s0"]
    step = plan.steps["s0"]
    cache = StepCache(MemoryJournal(), time.time, lookup=True, redact=None)
    tool, args = tools["plain"], {"x": 0}
    loops = 200_000

    def nothing(caching: bool = False) -> object:  # the timing loop's own call, subtracted
        return None

    floor = min(timeit.repeat(nothing, number=loops, repeat=5))
    found = {}
    for label, caching in (("no_tool_declares_cache", False), ("some_tool_declares_cache", True)):
        def hook(caching: bool = caching) -> object:
            return cache.entry(plan, rec, tool, args) if caching or step.cache else None

        best = min(timeit.repeat(hook, number=loops, repeat=5))
        found[label] = round(max(0.0, best - floor) / loops * 1e9, 1)
    return found


def run_bench(steps: int = 50, step_ms: float = 20.0, overhead_steps: int = 500, repeats: int = 5,
              postgres: str | None = None) -> dict[str, Any]:
    """Both tables (see the module doc) as one JSON-ready dict: on SQLite, and on PostgreSQL too if ``postgres``
    (a database URL: the benchmark works in a schema of its own, dropped after)."""
    journals: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="planweave-bench-cache-") as tmp:
        directory = Path(tmp)

        def sqlite(name: str) -> str:
            return f"sqlite:///{directory / f'{name}.db'}"

        async def both(urls: Callable[[str], str]) -> dict[str, Any]:
            return {"reuse": await _reuse(urls("reuse"), steps, step_ms),
                    "overhead": await _overhead(urls, overhead_steps, repeats)}

        journals["sqlite"] = asyncio.run(both(sqlite))
    if postgres is not None:
        journals["postgres"] = _on_postgres(postgres, both)
    return {**journals["sqlite"], "journals": journals, "hook_ns_per_attempt": _hook_ns()}


def _on_postgres(base: str, both: Callable[[Callable[[str], str]], Coroutine[Any, Any, dict[str, Any]]]
                 ) -> dict[str, Any]:
    import secrets

    import psycopg
    from psycopg import sql

    schema = f"pw_bench_cache_{secrets.token_hex(4)}"
    separator = "&" if "?" in base else "?"

    def url(name: str) -> str:  # one schema: every overhead run has fresh arguments anyway
        return f"{base}{separator}schema={schema}"

    try:
        return asyncio.run(both(url))
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def render(result: Mapping[str, Any]) -> str:
    """The two tables as text, per journal."""
    parts = [_render_journal(name, found) for name, found in result["journals"].items()]
    hook = result["hook_ns_per_attempt"]
    parts.append(f"the hook on a step that is not cacheable: {hook['no_tool_declares_cache']} ns per attempt when "
                 f"no tool declares cache, {hook['some_tool_declares_cache']} ns when one does (timed alone, the "
                 "timing loop's own call subtracted)")
    return "\n\n".join(parts)


def _render_journal(name: str, result: Mapping[str, Any]) -> str:
    r = result["reuse"]
    lines = [f"reuse: a second run of a chain of {r['steps']} cacheable steps of {r['step_ms']:g} ms ({name})", "",
             f"{'second run':<22} {'wall s':>8} {'tool calls':>10}",
             f"{'cache on (all hits)':<22} {r['second_cached_s']:>8.3f} {r['second_cached_calls']:>10}",
             f"{'--no-cache':<22} {r['second_no_cache_s']:>8.3f} {r['second_no_cache_calls']:>10}",
             f"(first run {r['first_s']:.3f} s; the cache makes the second run {r['speedup']}x faster)", "",
             f"overhead: µs per step of steps returning at once, each with its own arguments ({name}; median and "
             "fastest of the repeats, each against the not cacheable case)", "",
             f"{'shape':<8} {'case':<26} {'µs/step':>8} {'ratio':>6} {'min µs':>8} {'ratio':>6}"]
    for row in result["overhead"]:
        lines.append(f"{row['shape']:<8} {row['case']:<26} {row['us_per_step']:>8.1f} {row['vs_not_cacheable']:>6} "
                     f"{row['us_per_step_min']:>8.1f} {row['min_vs_not_cacheable']:>6}")
    return "\n".join(lines)


def _command(
    steps: Annotated[int, typer.Option("--steps", min=1, help="Cacheable slow steps in the reuse chain.")] = 50,
    step_ms: Annotated[float, typer.Option("--step-ms", min=0, help="Milliseconds each slow step sleeps.")] = 20.0,
    overhead_steps: Annotated[int, typer.Option("--overhead-steps", min=1,
                                                help="Steps per overhead run (chain and fan-out).")] = 500,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Runs per overhead case (median).")] = 5,
    postgres: Annotated[str | None, typer.Option("--postgres", metavar="URL", help=(
        "Also on this PostgreSQL database (in a schema of its own, dropped after)."))] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """A second run of cacheable slow steps with and without the cache, and what a miss costs per step."""
    return run_bench(steps, step_ms, overhead_steps, repeats, postgres), json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench cache")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
