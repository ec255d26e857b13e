"""Deadline pressure reaches cascades: under ``faster_tiers`` a hurried run's ``model: cascade`` steps run on the
fastest tier at or above the one their monitors brought them to (never below an escalation), against the
scripted server on the virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from planweave import Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.allocate import AllocationSeam, TierProfile, TierTable
from planweave.allocate.cascade import Cascade
from planweave.allocate.cascade_seam import CascadeSeam
from planweave.allocate.pressure_watch import PressureWatch
from planweave.core.events import Event
from planweave.core.plan.model import DeadlinePressure
from planweave.engine.runtime import cancel_at_deadline
from planweave.forecast.live import LiveOptions, start_live_forecast
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.testing import RecordedRequest, Reply, ScriptedLLM, Text
from planweave.tools.llm import llm_tool

# The cheap tier is a slow model (6 s on the server), the dearer one a fast hosted one (1 s): a cascade starts cheap.
TIERS = TierTable({
    "local": TierProfile("local", "m-local", p_success=0.9, duration_s=6.0, cost_usd=0.0001),
    "hosted": TierProfile("hosted", "m-hosted", p_success=0.95, duration_s=1.0, cost_usd=0.001),
})
LATENCY = {"m-local": 6.0, "m-hosted": 1.0}


async def by_latency(request: RecordedRequest) -> Reply:
    await asyncio.sleep(LATENCY.get(request.body["model"], 0.0))
    return Text("ok")


def cascaded(sid: str, after: list[str]) -> dict[str, Any]:
    return {"id": sid, "tool": "llm", "after": after, "estimate": {"duration": 3},
            "args": {"prompt": f"{sid}?", "model": "cascade", "max_tokens": 10}}


# s1 -> s2 -> s3 (3 s each, the plan says) beside 'tick' (5.5 s): in time for 11 s at first; when 'tick' ends at
# 5.5, s1 (6 s on the local model) is overdue and the forecast is late.
PLAN = {"steps": [cascaded("s1", []), cascaded("s2", ["s1"]), cascaded("s3", ["s2"]),
                  {"id": "tick", "tool": "sleep", "args": {"seconds": 5.5}, "estimate": {"duration": 5.5}}]}
DEADLINE = 11.0


def run_cascade(pressure: DeadlinePressure | None) -> tuple[str, list[Event], list[str]]:
    async def go() -> tuple[str, list[Event], list[str]]:
        server = ScriptedLLM(by_latency)
        async with server as base_url, OpenAIChatClient("m-local", base_url=base_url, api_key="k",
                                                        backoff=Backoff(attempts=1, base=0.01, cap=0.02)) as client:
            clock = VirtualClock()
            seam = AllocationSeam(TIERS)
            steps = CascadeSeam(TIERS, hurried=seam.hurried)
            tools = builtin_tools().merged(Toolbox({"llm": llm_tool(client, None, allocation=seam,
                                                                    cascade=steps)}))
            async with open_engine("memory://", clock=clock, tools=tools) as engine:
                seam.bind(engine.get)
                steps.bind(engine)
                run = await engine.start(PLAN, run_id="c")
                cancel_at_deadline(engine, run, DEADLINE)
                live = start_live_forecast(engine, run, LiveOptions(deadline=DEADLINE, runs=50, share=None))
                if pressure is not None:
                    PressureWatch(run, pressure, seam=seam)
                result = await run.wait()
                await (await live).wait()
                events = list(await engine.journal.read(run.id))
            return result.status, events, [str(r.body["model"]) for r in server.chat_requests]

    return run_virtual(go())


def test_under_pressure_a_cascade_jumps_to_the_fastest_tier_and_the_run_ends_in_time() -> None:
    status, events, models = run_cascade(DeadlinePressure.model_validate({"actions": ["faster_tiers"]}))
    assert status == "succeeded"
    (escalation,) = [e for e in events if e.kind == "escalation"]
    assert (escalation.data["action"], escalation.at) == ("faster_tiers", 5.5)
    assert escalation.data["steps"] == ["s1", "s2", "s3"]
    assert models == ["m-local", "m-hosted", "m-hosted"]
    assert events[-1].kind == "run_finished" and events[-1].at == 8.0


def test_without_pressure_the_cascade_stays_cheap_and_the_deadline_stops_the_run() -> None:
    status, events, models = run_cascade(None)
    assert status == "cancelled"
    assert not [e for e in events if e.kind == "escalation"]
    assert models == ["m-local", "m-local"]


@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6), st.integers(0, 5))
def test_the_hurried_tier_is_never_below_the_monitors_tier_and_none_above_it_is_faster(
        durations: list[float], at: int) -> None:
    names = [f"t{i}" for i in range(len(durations))]
    table = TierTable({n: TierProfile(n, f"m{i}", p_success=0.9, duration_s=d, cost_usd=float(i))
                       for i, (n, d) in enumerate(zip(names, durations, strict=True))})
    at = min(at, len(names) - 1)
    picked = CascadeSeam(table, hurried=lambda _: True)._fastest(Cascade(names), at)
    assert picked >= at
    assert all(durations[picked] <= durations[i] for i in range(at, len(names)))
