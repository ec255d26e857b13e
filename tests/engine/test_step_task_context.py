"""A step's task runs in the context its run was created in, not in the context of whoever admitted it.

Steps stream in while the planner's model call is still open (inside its ``call_context``); a step admitted there
must not inherit that call's class (its run, purpose, priority): four concurrent episodes once queued each other's
``llm`` steps under the wrong run (issue 31's gateway found it)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from planweave import Engine, Toolbox, VirtualClock, run_virtual
from planweave.journal.memory import MemoryJournal
from planweave.models.admission import CallClass, call_class, call_context

PROBE: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="unset")


def toolbox() -> Toolbox:
    box = Toolbox()

    @box.tool(idempotent=True)
    async def look() -> dict[str, Any]:
        """What the step's task sees of the context vars."""
        call = call_class()
        return {"probe": PROBE.get(), "run": call.run_id, "purpose": call.purpose}

    return box


def test_a_step_admitted_inside_the_planners_call_context_sees_its_own_run() -> None:
    async def go() -> dict[str, Any]:
        PROBE.set("created")
        async with Engine(MemoryJournal(), clock=VirtualClock(), tools=toolbox()) as engine:
            run = await engine.start({"steps": []}, hold=True)

            async def planner() -> None:
                PROBE.set("planner")
                with call_context(CallClass(run_id="another-run", purpose="planner")):
                    run.extend([{"id": "a", "tool": "look"}], trigger="initial", model_started_at=0.0)
                    await asyncio.sleep(1)  # the step runs while the planner's call is still open

            await asyncio.create_task(planner())
            run.release()
            result = await run.wait()
            assert result.ok
            return dict(result.outputs["a"])

    seen = run_virtual(go())
    assert seen["purpose"] == "llm_step"
    assert seen["run"] != "another-run"
    assert seen["probe"] == "created"
