"""``planweave bench storm`` (issue 33, part 2) in its quick form, on the virtual clock: the same figures every run.

planweave, told the provider's limits (tokens per minute, requests in flight), completes every call of the storm and
keeps every result; the only tokens it wastes are those of the calls the provider cut. The metered provider itself
is checked against a real HTTP client: 429 with a Retry-After past its concurrency and its tokens per minute. The
peers' figures are printed by the command and kept in docs/benchmarks.md, never asserted; a peer that is not
installed is reported as skipped with the reason.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from planweave import run_virtual
from planweave.bench import storm
from planweave.bench.storm import StormSettings, SystemResult, run_storm
from planweave.bench.storm_provider import ChatCall, MeteredProvider, ProviderLimits, Say, call_tag

QUICK = StormSettings(calls=50, tokens_per_minute=1_500)


@pytest.fixture(scope="module")
def planweave_storm() -> SystemResult:
    [result] = run_storm(QUICK, ["planweave"])
    return result


def test_planweave_completes_and_keeps_every_call(planweave_storm: SystemResult) -> None:
    r = planweave_storm
    assert (r.status, r.completed, r.kept) == ("finished", QUICK.calls, QUICK.calls), r


def test_planweave_wastes_no_more_tokens_than_the_cut_calls_cost(planweave_storm: SystemResult) -> None:
    cuts = len(QUICK.cut_keys())
    assert cuts > 0
    assert 0 < planweave_storm.wasted_tokens <= cuts * QUICK.call_tokens(), planweave_storm


def test_planweave_admission_keeps_under_the_limits(planweave_storm: SystemResult) -> None:
    # Told the limits, admission sends nothing the provider must refuse, and finishes near the floor.
    assert planweave_storm.rate_limited == 0, planweave_storm
    assert planweave_storm.seconds <= 1.25 * planweave_storm.floor_seconds, planweave_storm


def test_a_peer_that_is_not_installed_is_reported_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    runner, _, packages = storm.RUNNERS["pydantic-ai"]
    monkeypatch.setitem(storm.RUNNERS, "pydantic-ai", (runner, ("no_such_module_pw33",), packages))
    [result] = run_storm(QUICK, ["pydantic-ai"])
    assert result.status == "skipped"
    assert "no_such_module_pw33" in result.reason


def test_the_provider_answers_429_with_retry_after_past_its_limits() -> None:
    async def main() -> tuple[list[tuple[int, str | None]], list[tuple[int, str | None]]]:
        def script(call: ChatCall) -> Say:
            return Say("one two three four")

        def body(key: str, max_tokens: int) -> dict[str, object]:
            return {"model": "m", "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": call_tag(key)}]}

        busy = MeteredProvider(script, limits=ProviderLimits(max_concurrency=2, concurrency_retry_after=0.5))
        async with busy as url, httpx.AsyncClient() as http:
            answers = await asyncio.gather(*(http.post(f"{url}/chat/completions", json=body(f"c{i}", 4))
                                             for i in range(4)))
        by_concurrency = sorted((r.status_code, r.headers.get("retry-after")) for r in answers)
        metered = MeteredProvider(script, limits=ProviderLimits(tokens_per_minute=100))
        async with metered as url, httpx.AsyncClient() as http:
            first = await http.post(f"{url}/chat/completions", json=body("t0", 80))
            second = await http.post(f"{url}/chat/completions", json=body("t1", 80))
        return by_concurrency, [(r.status_code, r.headers.get("retry-after")) for r in (first, second)]

    by_concurrency, by_tokens = run_virtual(main())
    assert by_concurrency == [(200, None), (200, None), (429, "0.500"), (429, "0.500")]
    assert by_tokens[0] == (200, None)
    status, retry_after = by_tokens[1]
    # 80 + ~10 tokens taken from a bucket of 100 that refills 100 a minute: the second waits for ~80 more to come.
    assert status == 429 and retry_after is not None and 40 < float(retry_after) < 60, by_tokens


def test_a_stopped_run_keeps_every_call_it_completed() -> None:
    # Stopped halfway to the floor: the results of the calls that finished stay (in the journal), none is lost.
    settings = StormSettings(calls=QUICK.calls, tokens_per_minute=QUICK.tokens_per_minute, stop=0.5)
    [result] = run_storm(settings, ["planweave"])
    assert result.status == "stopped", result
    assert 0 < result.kept == result.completed < settings.calls, result
