"""The durability workload on planweave: a child process that starts the run, or resumes it as the docs say.

``python -m planweave.bench.durability_planweave SPEC_JSON``. Start: ``Engine.start`` of the fan-out plan on the
journal (SQLite file or PostgreSQL URL). Resume (README, "Crash and resume"): ``Engine.resume(run_id)``, which re-runs
the idempotent steps that were running and stops short of the others (``unknown``); then, as documented, "check
their effects, then ``--retry-unknown``": if none of the unknown steps' effects is in the effects file, the run is
resumed again with ``retry_unknown=True``; if one is there, the steps whose effect is there are marked done first, as
a person would with ``planweave resume RUN --done STEP`` (:func:`~planweave.engine.runtime.mark_done`), and the run
is counted apart (``marked_done``: it needed a person's word, not only a resume).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from planweave.bench.durability_effects import (
    EFFECTS,
    JOIN,
    ChildSpec,
    append_effect,
    begin,
    is_keyed,
    read_lines,
    report,
    step_ids,
)
from planweave.core.errors import RunError, RunNotFound
from planweave.core.state import RunState
from planweave.engine import Engine, RunResult
from planweave.engine.runtime import mark_done
from planweave.journal import open_journal
from planweave.tools.registry import Toolbox


async def effect(run_dir: str, step: str, ms: int) -> str:
    """Sleep ``ms`` milliseconds, then write ``step``'s effect."""
    begin(run_dir, step)
    await asyncio.sleep(ms / 1000)
    append_effect(run_dir, step)
    return step


def tools() -> Toolbox:
    """Two tools on the same function: ``effect_keyed`` (idempotent: its effect is keyed) and ``effect_plain``."""
    box = Toolbox()
    box.add(effect, name="effect_keyed", idempotent=True)
    box.add(effect, name="effect_plain", idempotent=False)
    return box


def plan(spec: ChildSpec) -> dict[str, Any]:
    """The fan-out of effect steps and the join after them, as a plan document."""
    fan = step_ids(len(spec.durations_ms))
    steps: list[dict[str, Any]] = [
        {"id": sid, "tool": "effect_keyed" if is_keyed(sid) else "effect_plain",
         "args": {"run_dir": spec.run_dir, "step": sid, "ms": ms}}
        for sid, ms in zip(fan, spec.durations_ms, strict=True)
    ]
    steps.append({"id": JOIN, "tool": "effect_keyed", "args": {"run_dir": spec.run_dir, "step": JOIN, "ms": 0},
                  "after": fan})
    return {"steps": steps}


def _journal_url(store: str) -> str:
    return store if store.startswith("postgresql://") else f"sqlite:///{store}"


def _unknown(result: RunResult) -> list[str]:
    return [sid for sid, rec in result.state.records.items() if rec.status == "unknown"]


async def _resume(engine: Engine, spec: ChildSpec, toolbox: Toolbox) -> dict[str, Any]:
    try:
        result = await (await engine.resume(spec.run_id, tools=toolbox)).wait()
    except RunNotFound:
        return {"outcome": "not_found", "detail": "no run in the journal (killed before run_created was stored)"}
    except RunError:
        # Killed after the run ended (on its way out): resume refuses, and the journal says how it ended.
        status = RunState.from_events(spec.run_id, await engine.journal.read(spec.run_id)).status
        return {"outcome": "completed" if status == "succeeded" else "failed",
                "detail": f"the run had already ended ({status}) when it was killed"}
    unknown = _unknown(result)
    if result.ok or not unknown:
        return {"outcome": "completed" if result.ok else "failed", "detail": result.error or ""}
    # The documented check: an unknown step whose effect happened cannot be retried without repeating it.
    done = set(read_lines(Path(spec.run_dir) / EFFECTS))
    happened = sorted(sid for sid in unknown if sid in done)
    for sid in happened:  # as a person would, having read the effects file: `planweave resume RUN --done STEP`
        await mark_done(engine.journal, spec.run_id, sid, sid, by="bench durability (the effects file shows it)")
    result = await (await engine.resume(spec.run_id, tools=toolbox, retry_unknown=True)).wait()
    if happened:
        return {"outcome": "marked_done" if result.ok else "failed", "unknown": unknown,
                "detail": f"unknown step(s) {', '.join(happened)} already had their effect: marked done"}
    return {"outcome": "completed" if result.ok else "failed", "detail": result.error or "",
            "retried_unknown": unknown}


async def main_async(spec: ChildSpec) -> None:
    """Start or resume the run of ``spec`` and report how it ended."""
    toolbox = tools()
    async with open_journal(_journal_url(spec.store)) as journal, Engine(journal, tools=toolbox) as engine:
        report("READY")
        began = time.perf_counter()
        if spec.mode == "start":
            result = await (await engine.start(plan(spec), tools=toolbox, run_id=spec.run_id)).wait()
            outcome: dict[str, Any] = {"outcome": "completed" if result.ok else "failed",
                                       "detail": result.error or ""}
        else:
            outcome = await _resume(engine, spec, toolbox)
        report("DONE", call_s=time.perf_counter() - began, **outcome)


if __name__ == "__main__":
    asyncio.run(main_async(ChildSpec.from_json(sys.argv[1])))
