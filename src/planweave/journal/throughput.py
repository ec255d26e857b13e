"""How many events per second a journal stores durably, under a load shaped like the engine's."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from planweave.core.events import Event
from planweave.journal import open_journal

__all__ = ["measure_throughput"]

# The engine emits events from many step tasks between which the loop switches; yielding every few events
# reproduces that, so batches form the way they do in a real run instead of as one giant transaction.
_EVENTS_PER_YIELD = 8


async def measure_throughput(url: str, events: int = 20000) -> dict[str, Any]:
    """Append ``events`` step events (with small data and outputs) to a fresh run at ``url``, flush, and time it.

    Returns ``{"events": n, "seconds": s, "events_per_s": x}``; the time runs from the first append until the
    flush has returned, i.e. until everything is stored (durably, for durable journals). Opening and closing
    the journal are not timed.
    """
    if events < 1:
        raise ValueError("events must be at least 1")
    run_id = f"throughput-{uuid.uuid4().hex[:12]}"
    async with open_journal(url) as journal:
        start = time.perf_counter()
        journal.append(Event(run_id, "run_created", time.time(), None, {"plan": {"steps": events // 2}}))
        n = 1
        step = 0  # counts events after run_created: even ones start step step//2, odd ones finish it
        while n < events:
            sid = f"step-{step // 2}"
            if step % 2 == 0:
                journal.append(Event(run_id, "step_started", time.time(), sid, {"attempt": 1}))
            else:
                ref = journal.put_blob({"step": sid, "result": step // 2, "tokens": [step % 7, step % 11]})
                data = {"attempt": 1, "output": ref}
                journal.append(Event(run_id, "step_succeeded", time.time(), sid, data))
            n += 1
            step += 1
            if n % _EVENTS_PER_YIELD == 0:
                await asyncio.sleep(0)
        await journal.flush()
        seconds = time.perf_counter() - start
    return {"events": n, "seconds": seconds, "events_per_s": n / seconds if seconds > 0 else float("inf")}
