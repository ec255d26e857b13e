"""The context benchmark: planner prompt tokens per re-plan as a goal run grows, by reference vs the state summary.

One goal per context mode runs on the real planning loop and engine (``memory://`` journal, virtual clock) against
the scripted OpenAI-compatible server on 127.0.0.1. The scripted planner writes the plan in batches of ``--batch``
no-op steps whose last one is an observation: each batch that finishes triggers a re-plan, whose reply is the next
batch (and, with references, a ``{"report": ...}`` line). The run goes on to the largest checkpoint of finished
steps (100, 1,000 and 5,000 by default), then the joiner answers.

Measured, for each checkpoint: the prompt tokens of the re-plan asked once that many steps had finished, for
``context="references"`` (``prompt_tokens``) and for the state summary of before (``baseline``), in the same run of
the benchmark. Prompt tokens are a tokenizer-free estimate of what the scripted server received: the server's own
usage formula, ``ceil(chars / 4) + 4`` per message ``+ 2`` (the figure it reports as ``usage.prompt_tokens``).

``planweave bench context [--json] [--quick]`` or ``python -m planweave.bench.context``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import typer

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.bench.cli import parse_command_line
from planweave.models.openai import OpenAIChatClient
from planweave.planning import PlanningLoop, PlanningOptions
from planweave.planning.context import ContextLimits
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Text, plan_lines

__all__ = ["ContextRun", "estimate_prompt_tokens", "main", "measure", "run_goal"]

Mode = Literal["references", "summary"]
JOIN_MARK = "If the results answer the goal"
REPLAN_MARK = "REMAINING plan"
TOKENS_NOTE = ("estimate: ceil(chars/4)+4 per message +2 over the messages the scripted server received (its "
               "usage.prompt_tokens formula; no tokenizer)")


def estimate_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """The scripted server's prompt-token count of ``messages`` (``ceil(chars / 4) + 4`` each, ``+ 2``)."""
    return sum(math.ceil(len(str(m.get("content") or "")) / 4) + 4 for m in messages) + 2


@dataclass
class ContextRun:
    """One goal run: the prompt tokens of each re-plan, by the finished steps when it was asked."""

    mode: Mode
    steps: int  # finished steps the run went to
    replan_tokens: dict[int, int] = field(default_factory=dict)  # finished steps -> that re-plan's prompt tokens
    blind: int = 0  # re-plans whose prompt did not name the step that had just finished (the trigger)
    join_tokens: int = 0
    ok: bool = False
    error: str | None = None
    finished_steps: int = 0
    replans: int = 0
    seconds: float = 0.0


def _batch(n: int, size: int, blob: int) -> list[dict[str, Any]]:
    """Batch ``n``: ``size`` no-op steps, the last one after the others and an observation (a re-plan trigger)."""
    ids = [f"b{n}_{i}" for i in range(size)]
    steps: list[dict[str, Any]] = [{"id": s, "tool": "noop", "args": {"data": f"{s}:" + "x" * blob}}
                                   for s in ids[:-1]]
    steps.append({"id": ids[-1], "tool": "noop", "args": {"n": n}, "after": ids[:-1], "observe": True})
    return steps


async def run_goal(mode: Mode, steps: int, *, batch: int = 10, blob: int = 200,
                   limits: ContextLimits | None = None) -> ContextRun:
    """Run one goal to ``steps`` finished steps (a multiple of ``batch``) with context ``mode`` (and the references'
    ``limits``, default :class:`ContextLimits`)."""
    out = ContextRun(mode, steps)
    batches = steps // batch
    written = {"n": 0}

    def script(req: RecordedRequest) -> Reply:
        last = str(req.messages[-1].get("content", "")) if req.messages else ""
        tokens = estimate_prompt_tokens(req.messages)
        if JOIN_MARK in last:
            out.join_tokens = tokens
            return Text(json.dumps({"answer": f"{written['n'] * batch} steps done"}))
        if REPLAN_MARK in last:
            out.replan_tokens[written["n"] * batch] = tokens  # every batch written so far has finished
            if f'"b{written["n"]}_{batch - 1}' not in last and f"b{written['n']}_{batch - 1} (" not in last:
                out.blind += 1
        if written["n"] >= batches:
            return Text("[]\n")
        written["n"] += 1
        lines: list[dict[str, Any]] = []
        if mode == "references":
            lines.append({"report": f"wrote {written['n']} of {batches} batches; next: batch {written['n'] + 1}"})
        return Text(plan_lines([*lines, *_batch(written["n"], batch, blob)]))

    tools = builtin_tools()
    options = PlanningOptions(context=mode, max_replans=batches + 2, model_capacity=None,
                              context_limits=limits or ContextLimits())
    started = time.perf_counter()
    async with ScriptedLLM(script) as url, OpenAIChatClient("scripted", base_url=url, api_key="bench") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        loop = PlanningLoop(engine, client, tools, options=options)
        result = await loop.run(f"do {steps} small steps, {batch} at a time")
    out.seconds = round(time.perf_counter() - started, 2)
    out.ok, out.error = result.ok, result.error
    out.finished_steps = sum(1 for r in result.state.records.values() if r.status == "succeeded")
    out.replans = len(out.replan_tokens)
    return out


def _at(run: ContextRun, n: int) -> int | None:
    """The prompt tokens of the re-plan asked at ``n`` finished steps (None: the run never got there)."""
    return run.replan_tokens.get(n)


async def measure(checkpoints: Sequence[int], *, batch: int = 10, blob: int = 200) -> dict[str, Any]:
    """Both modes to the largest checkpoint; the re-plan prompt tokens at each checkpoint, and the runs' figures."""
    top = max(checkpoints)
    runs = {mode: await run_goal(mode, top, batch=batch, blob=blob) for mode in ("references", "summary")}
    refs, base = runs["references"], runs["summary"]
    return {
        "prompt_tokens": {str(n): _at(refs, n) for n in checkpoints},
        "baseline": {str(n): _at(base, n) for n in checkpoints},
        "join_prompt_tokens": {"references": refs.join_tokens, "baseline": base.join_tokens},
        "max_replan_prompt_tokens": {"references": max(refs.replan_tokens.values(), default=0),
                                     "baseline": max(base.replan_tokens.values(), default=0)},
        "runs": {("references" if m == "references" else "baseline"): {
            "ok": r.ok, "error": r.error, "finished_steps": r.finished_steps, "replans": r.replans,
            "replans_not_shown_newest_step": r.blind,
            "seconds": r.seconds} for m, r in runs.items()},
        "settings": {"batch": batch, "blob_chars": blob, "replan_every_steps": batch, "journal": "memory://",
                     "clock": "virtual"},
        "tokens": TOKENS_NOTE,
    }


@dataclass(frozen=True)
class _Options:
    steps: tuple[int, ...]
    batch: int
    blob: int
    quick: bool
    json: bool


def _options(
    steps: Annotated[str, typer.Option(help="checkpoints of finished steps, comma-separated")] = "100,1000,5000",
    batch: Annotated[int, typer.Option(min=2, help="steps per batch: a re-plan every this many finished steps")] = 10,
    blob: Annotated[int, typer.Option(min=0, help="characters of data in each step's arguments (and output)")] = 200,
    quick: Annotated[bool, typer.Option("--quick", help="checkpoints 20,100 (a test's run)")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> _Options:
    """Planner prompt tokens per re-plan as a goal run grows to thousands of steps: the context by reference vs the
    state summary, on the scripted model server."""
    try:
        points = tuple(sorted({int(p) for p in steps.split(",") if p.strip()}))
    except ValueError:
        raise typer.BadParameter(f"--steps: a comma-separated list of step counts, got {steps!r}") from None
    if not points or any(p < batch or p % batch for p in points):
        raise typer.BadParameter(f"--steps: each checkpoint must be a positive multiple of --batch ({batch}), "
                                 f"got {steps!r}")
    return _Options((20, 100) if quick else points, batch, blob, quick, json_output)


def render(data: dict[str, Any]) -> str:
    """The results as a table."""
    points = list(data["prompt_tokens"])
    rows = [("finished steps", *points),
            ("references (tokens)", *(str(data["prompt_tokens"][p]) for p in points)),
            ("summary baseline (tokens)", *(str(data["baseline"][p]) for p in points))]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    runs = data["runs"]
    lines.append("runs: " + "; ".join(
        f"{name} {'ok' if r['ok'] else 'FAILED: ' + str(r['error'])}, {r['finished_steps']} steps, "
        f"{r['replans']} re-plans ({r['replans_not_shown_newest_step']} not shown the newest finished step), "
        f"{r['seconds']}s" for name, r in runs.items()))
    lines.append(f"re-plan prompt tokens per re-plan ({data['settings']['batch']} steps each); {data['tokens']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print the table (or ``--json``)."""
    args = parse_command_line(_options, argv, "planweave bench context")
    data = run_virtual(measure(args.steps, batch=args.batch, blob=args.blob))
    print(json.dumps(data) if args.json else render(data))
    return 0 if all(r["ok"] for r in data["runs"].values()) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
