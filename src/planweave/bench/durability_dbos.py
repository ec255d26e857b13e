"""The durability workload on DBOS: a child process that starts the workflow, or relaunches and lets DBOS recover it.

``python -m planweave.bench.durability_dbos SPEC_JSON``. An async ``@DBOS.workflow()`` starts one ``@DBOS.step()``
per fan-out step as tasks created in a fixed order and gathers them (DBOS's documented way to run async steps in
parallel: started in a deterministic order), then runs the join step. The system database is the PostgreSQL URL of
the spec. Start: ``DBOS.start_workflow_async`` under ``SetWorkflowID(run_id)``. Resume (docs "How Workflows Work":
on restart DBOS recovers PENDING workflows from their last completed step): configure DBOS the same way, call
``DBOS.launch()`` (which recovers them), then wait for the workflow's result through its handle.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from planweave.bench.durability_effects import JOIN, ChildSpec, append_effect, begin, report, step_ids

APP_NAME = "planweave-bench-durability"


@DBOS.step()
async def effect(run_dir: str, step: str, ms: int) -> str:
    """Sleep ``ms`` milliseconds, then write ``step``'s effect."""
    begin(run_dir, step)
    await asyncio.sleep(ms / 1000)
    append_effect(run_dir, step)
    return step


@DBOS.workflow()
async def fan_out(run_dir: str, durations_ms: list[int]) -> list[str]:
    """Every effect step in parallel (tasks created in a fixed order), then the join."""
    tasks = [asyncio.create_task(effect(run_dir, sid, ms))
             for sid, ms in zip(step_ids(len(durations_ms)), durations_ms, strict=True)]
    done = list(await asyncio.gather(*tasks))
    done.append(await effect(run_dir, JOIN, 0))
    return done


async def main_async(spec: ChildSpec) -> None:
    """Start the workflow of ``spec``, or relaunch DBOS to recover it; report how it ended."""
    config: DBOSConfig = {"name": APP_NAME, "system_database_url": spec.store, "log_level": "WARNING"}
    DBOS(config=config)
    if spec.mode == "start":
        DBOS.launch()
        report("READY")  # the kill schedule's clock starts here, as for the other systems: at the run's start
        began = time.perf_counter()
    else:
        report("READY")
        began = time.perf_counter()
        DBOS.launch()  # on a relaunch, this recovers the PENDING workflows of this executor
    outcome: dict[str, Any]
    try:
        if spec.mode == "start":
            with SetWorkflowID(spec.run_id):
                handle = await DBOS.start_workflow_async(fan_out, spec.run_dir, list(spec.durations_ms))
        else:
            found = await DBOS.get_workflow_status_async(spec.run_id)
            if found is None:
                report("DONE", call_s=time.perf_counter() - began, outcome="not_found",
                       detail="no workflow with that id (killed before it was recorded)")
                return
            handle = await DBOS.retrieve_workflow_async(spec.run_id)
        done = await handle.get_result()
        outcome = {"outcome": "completed" if JOIN in done else "failed", "detail": ""}
    except Exception as exc:  # the workflow's own failure, reported rather than raised: it is a figure
        outcome = {"outcome": "failed", "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        DBOS.destroy()
    report("DONE", call_s=time.perf_counter() - began, **outcome)


if __name__ == "__main__":
    asyncio.run(main_async(ChildSpec.from_json(sys.argv[1])))
