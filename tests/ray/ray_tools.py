"""Tools for the Ray tests: top-level functions, so a Ray worker imports them by reference."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from planweave import Toolbox, builtin_tools, current_step


async def where(note: str = "") -> dict[str, Any]:
    """Say which process ran the call, and what Ray gave it (nothing outside Ray)."""
    assigned: dict[str, float] = {}
    try:
        import ray

        runtime: Any = ray.get_runtime_context() if ray.is_initialized() else None
        if runtime is not None and runtime.worker.mode == ray.WORKER_MODE:
            assigned = {k: float(v) for k, v in runtime.get_assigned_resources().items()}
    except ImportError:
        pass
    return {"pid": os.getpid(), "assigned": assigned, "step": current_step().step_id, "note": note}


def flaky(counter: str, token: str) -> dict[str, Any]:
    """Fail on the first call (counted in the file ``counter``), then return ``token`` (a sync tool)."""
    path = Path(counter)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    if calls == 1:
        raise ConnectionError(f"first call fails, token {token}")
    return {"calls": calls, "token": token}


def own_tools() -> Toolbox:
    """These tools alone (``--tools tests.ray.ray_tools:own_tools``: the CLI adds the built-ins)."""
    box = Toolbox()
    for fn in (where, flaky, gated):
        box.add(fn, idempotent=True)
    return box


def toolbox() -> Toolbox:
    """The built-ins and these tools."""
    return builtin_tools().merged(own_tools())


def gated(log: str, gate: str) -> str:
    """Record that it started, then wait until the file ``gate`` exists (the test opens it); a sync tool."""
    step = current_step()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{step.step_id} {os.getpid()}\n")
    while not Path(gate).exists():  # another process opens the gate: nothing to wait on but the file
        step.heartbeat()
        time.sleep(0.02)
    return step.step_id
