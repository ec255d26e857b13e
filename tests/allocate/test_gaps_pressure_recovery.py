"""A run the server recovers (or resumes on POST /runs/{id}/resume) gets its live forecast and deadline pressure
again (``server.limits.resume_within_limits``); a worker's run gets them from ``forecast_and_watch`` too. On the
virtual clock with a SQLite journal: the first engine is left with the run in flight (interrupted), the second
resumes it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.allocate.pressure_watch import forecast_and_watch
from planweave.core.events import Event
from planweave.forecast import live as live_module
from planweave.limits import RunLimits
from planweave.server.limits import resume_within_limits


@pytest.fixture(autouse=True)
def forecasts_have_room(monkeypatch: pytest.MonkeyPatch) -> None:
    # The forecasts' budget is wall time, which the virtual clock does not advance: under load the first refresh
    # used it up and the one after 'a' ended was never made, so nothing dropped 'extra' (failed ~1 run in 3 with
    # the machine busy). What is tested here is the wiring of recovery, not that budget (tests/forecast has it).
    monkeypatch.setattr(live_module, "INITIAL_ALLOWANCE_S", 60.0)


def sleeping(sid: str, seconds: float, estimate: float, after: list[str], **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "sleep", "args": {"seconds": seconds}, "after": after,
            "estimate": {"duration": estimate}, **extra}


# 'a' is estimated at 1 s and takes 3: once it ends, 'b' (1 s) fits the 5 s deadline and the optional 'extra' (3 s)
# does not.
LATE = {"steps": [sleeping("a", 3, 1, []), sleeping("b", 1, 1, ["a"]),
                  sleeping("extra", 3, 3, ["a"], optional=True)], "pressure": {"actions": ["drop_optional"]}}


def interrupted(url: str) -> str:
    async def go() -> str:
        async with open_engine(url, clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await engine.start(LATE, limits=RunLimits(deadline=5).journaled(engine.clock.now()))
            await asyncio.sleep(0.5)
            return run.id  # leaving the engine interrupts the run

    return run_virtual(go())


def test_a_recovered_run_is_forecast_and_its_pressure_drops_the_optional_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = interrupted(url)

    async def recover() -> tuple[str, dict[str, str], list[Event]]:
        async with open_engine(url, clock=VirtualClock(), tools=builtin_tools()) as engine:
            run = await resume_within_limits(engine, None, run_id)
            result = await run.wait()
            await asyncio.sleep(0)
            return (result.status, {s: r.status for s, r in result.state.records.items()},
                    list(await engine.journal.read(run_id)))

    status, steps, events = run_virtual(recover())
    assert status == "succeeded"
    assert steps["extra"] == "cancelled" and steps["b"] == "succeeded"
    assert [e.data["action"] for e in events if e.kind == "escalation"] == ["drop_optional"]
    assert [e for e in events if e.kind == "forecast"]  # the dashboard's forecast is back too


@pytest.mark.parametrize("pressure", [True, False])
def test_forecast_and_watch_on_a_started_run_acts_only_when_its_plan_asks(tmp_path: Path, pressure: bool) -> None:
    plan = LATE if pressure else {"steps": LATE["steps"]}

    async def go() -> tuple[str, list[Event], bool]:
        async with open_engine("memory://", clock=VirtualClock(), tools=builtin_tools()) as engine:
            from planweave.engine.runtime import cancel_at_deadline

            run = await engine.start(plan)
            cancel_at_deadline(engine, run, 5)
            watch = forecast_and_watch(engine, run, deadline_at=engine.clock.now() + 5, budget_usd=None)
            result = await run.wait()
            return result.status, list(await engine.journal.read(run.id)), watch is not None

    status, events, watched = run_virtual(go())
    assert watched is pressure
    assert [e for e in events if e.kind == "forecast"]
    assert status == ("succeeded" if pressure else "cancelled")
