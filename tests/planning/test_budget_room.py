"""Budgets that wait for room and count every token (issue 12 part 0), on the issue's own scenario.

A goal run whose plan has 12 small ``llm`` steps, under ``--budget-tokens``, against the scripted server (which
honours ``max_tokens`` and counts, server side, every token it sends, cut streams included). Before, at 2,000 tokens
the steps could not reserve beside the streaming planner and the run ended ``cancelled`` reporting 0 tokens; at
3,500 the joiner's worst case did not fit. Now calls wait, are lowered to a floor, are all counted, and a run the
budget stops ends ``failed`` naming it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planweave import VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.limits import RunLimits
from planweave.models.openai import OpenAIChatClient
from planweave.planning import build_planning_loop
from planweave.testing.scripted_llm import RecordedRequest, Reply, ScriptedLLM, Stall, Text, plan_lines
from tests.planning.budget_scenario import PLAN, STEPS, UsageMode, planner_worst_case, run_scenario
from tests.timing import on_virtual_clock, until


def spent_within(budget: int, reported: int, served: int) -> None:
    assert reported >= served, f"reported {reported} tokens, the server sent {served}"
    assert reported <= budget, f"reported {reported} tokens over the budget of {budget}"


# Retuned for the references context (the default since issue 14): its planner prompt (the report instructions,
# context.read in the catalog) and joiner prompt cost more here, 2,683 tokens spent before the joiner, whose worst
# case (1,677) no longer fits in 3,500 (the summary context succeeded at 3,500); 4,000 is the same loose-enough case.
@pytest.mark.parametrize(("budget", "status"), [(2000, "failed"), (4000, "succeeded"), (4500, "succeeded")])
def test_the_issues_scenario_ends_as_its_budget_allows_and_reports_what_the_server_sent(budget: int,
                                                                                         status: str) -> None:
    out = run_virtual(run_scenario(budget))
    assert out.result.status == status, out.result.error
    assert out.reported_tokens == out.served_tokens  # the server's own counts, every call (none cut here)
    spent_within(budget, out.reported_tokens, out.served_tokens)
    if status == "failed":  # stopped by its budget: a failure that names it, not a cancellation
        error = out.result.error
        assert error is not None and error.startswith("stopped by its budget: budget exceeded"), error
        assert f"of {budget}" in error
    else:
        assert out.result.summary["answer"] == "twelve words, one per topic"
        assert all(out.result.state.records[s["id"]].status == "succeeded" for s in PLAN)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(min_value=0, max_value=6000), usage=st.sampled_from(["final", "every", "none"]))
def test_from_tight_to_loose_budgets_spend_is_never_understated_nor_over_the_budget(budget: int,
                                                                                    usage: UsageMode) -> None:
    out = run_virtual(run_scenario(budget, usage=usage))
    spent_within(budget, out.reported_tokens, out.served_tokens)
    assert out.result.status in ("succeeded", "failed")
    if out.result.status == "failed":
        assert out.result.error is not None and "stopped by its budget" in out.result.error, out.result.error


def test_llm_steps_that_do_not_fit_beside_the_planner_wait_for_it_to_settle_instead_of_failing() -> None:
    budget = planner_worst_case() + 50  # the planner fits; no ~100-token step fits beside it while it streams
    out = run_virtual(run_scenario(budget))
    planner, steps = out.served[0], out.served[1:1 + STEPS]
    assert planner.ended is not None
    assert all(out.result.state.records[s["id"]].status == "succeeded" for s in PLAN)  # none refused: they waited
    assert all(c.started >= planner.ended for c in steps)  # ...for the planner's call to end and settle
    assert len(steps) == STEPS
    spent_within(budget, out.reported_tokens, out.served_tokens)
    assert out.result.status == "failed"  # the joiner, last, finds too little left: stopped by the budget
    assert out.result.error is not None and "stopped by its budget" in out.result.error


@on_virtual_clock
async def test_a_planner_stream_cut_by_a_cancelled_run_is_counted_and_marked_estimated() -> None:
    lines = plan_lines(PLAN[:4])

    def script(req: RecordedRequest) -> Reply:  # the planner writes four steps, then hangs
        text = " ".join(str(m.get("content")) for m in req.messages)
        return Stall(after=lines, seconds=None) if "Write the plan" in text else Text("Blue.")

    server = ScriptedLLM(script, tokens_per_second=100.0, honour_max_tokens=True)
    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=builtin_tools(), clock=VirtualClock()) as engine:
        loop = build_planning_loop(engine, client, builtin_tools(), RunLimits(budget_tokens=10_000))
        run = await loop.start("four topics")
        await until(run, lambda state: all(state.records.get(s["id"]) is not None and
                                           state.records[s["id"]].status == "succeeded" for s in PLAN[:4]),
                    "the four streamed steps succeeded")
        run.cancel("stopped by a person")
        result = await run.wait()
    # Journaled before the run ended (the cut planner's call included), so the run's own report counts it.
    calls = list(result.state.model_calls)
    planner = [c for c in calls if c["purpose"] == "plan"]
    assert len(planner) == 1, calls
    assert planner[0]["cut"] == "run stopped" and planner[0]["usage_source"] == "estimated"
    served = sum(c.tokens for c in server.served)
    assert result.summary["tokens"] == sum(int(c["prompt_tokens"]) + int(c["completion_tokens"]) for c in calls)
    assert result.summary["tokens"] >= served > 0
    assert result.status == "cancelled"  # a person stopped it, not the budget
