"""``planweave bench caps`` (issue 33, part 3) in its quick form: planweave stays within its dollar cap in every
scenario (a priced model, an unpriced one, calls cut mid-generation, parallel calls), as the provider bills it.

Each scenario's job would cost about three times the cap; the provider bills every token it generated at its own
price. The peers' figures are printed by the command and kept in docs/benchmarks.md, never asserted; a peer that is
not installed is reported as skipped with the reason.
"""

from __future__ import annotations

import pytest

from planweave.bench import caps
from planweave.bench.caps import SCENARIOS, CapResult, CapSettings, run_caps

QUICK = CapSettings(turns=12, reply_tokens=100)


@pytest.fixture(scope="module")
def planweave_caps() -> dict[str, CapResult]:
    return {r.scenario: r for r in run_caps(QUICK, ["planweave"])}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_planweave_spends_within_its_cap(planweave_caps: dict[str, CapResult], scenario: str) -> None:
    result = planweave_caps[scenario]
    assert result.spent_usd <= QUICK.cap_usd(), result
    assert result.within


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_cap_is_what_stopped_the_job(planweave_caps: dict[str, CapResult], scenario: str) -> None:
    # The job needs three caps' worth: it cannot finish; what ended it is the budget (or, unpriced, the refusal).
    result = planweave_caps[scenario]
    reason = "no price" if scenario == "unpriced" else "budget exceeded"
    assert result.ended.startswith("failed") and reason in result.ended, result


def test_an_unpriced_model_is_refused_before_any_call(planweave_caps: dict[str, CapResult]) -> None:
    result = planweave_caps["unpriced"]
    assert (result.spent_usd, result.calls) == (0.0, 0), result


def test_the_priced_job_spends_most_of_its_cap(planweave_caps: dict[str, CapResult]) -> None:
    # Within the cap by doing work, not by refusing everything: a call's worst case is reserved, so the last one
    # that does not fit is the only room left unspent.
    result = planweave_caps["priced"]
    assert result.spent_usd >= QUICK.cap_usd() - 2 * QUICK.turn_usd(), result


def test_a_peer_that_is_not_installed_is_reported_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    runner, _, packages, cap = caps.RUNNERS["openai-agents"]
    monkeypatch.setitem(caps.RUNNERS, "openai-agents", (runner, ("no_such_module_pw33",), packages, cap))
    results = run_caps(QUICK, ["openai-agents"], ["priced"])
    assert [r.skipped for r in results] == ["not installed: no_such_module_pw33 (pip install -e '.[bench]')"]
