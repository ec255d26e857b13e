"""``planweave bench admission``'s claim as an ordering on the virtual clock (issue 27, part 4): the adaptive window
with priority and aging gets more successful model calls per second out of a congested endpoint than a fixed
semaphore set above its limit, and far fewer 429s.

A small workload (30 runs of 4 ``llm`` steps at 16 runs/s; the server slows past 4 calls in flight and answers 429
past 8; the fixed semaphore is 16): the arrivals, the server's latency and its congestion are virtual time, so the
figures are the same on every run. The timings stay in docs/benchmarks.md.
"""

from __future__ import annotations

import pytest

from planweave import run_virtual
from planweave.bench.admission import Mode, ModeResult, main, measure_mode


def measured(mode: Mode) -> ModeResult:
    return run_virtual(measure_mode(mode, runs=30, rate=16.0, knee=4, hard_limit=8, fixed=16, ttft=0.3, tps=100.0))


@pytest.fixture(scope="module")
def modes() -> dict[str, ModeResult]:
    return {m: measured(m) for m in ("fixed", "adaptive")}


def test_every_run_succeeds_in_both_modes(modes: dict[str, ModeResult]) -> None:
    assert {m: (r.succeeded, r.calls_ok) for m, r in modes.items()} == {"fixed": (30, 120), "adaptive": (30, 120)}


def test_the_adaptive_window_has_more_goodput_than_a_fixed_semaphore(modes: dict[str, ModeResult]) -> None:
    fixed, adaptive = modes["fixed"], modes["adaptive"]
    assert adaptive.goodput_calls_s > fixed.goodput_calls_s, (adaptive, fixed)
    assert adaptive.rate_limited < fixed.rate_limited, (adaptive, fixed)


def test_the_figures_are_the_same_on_every_run(modes: dict[str, ModeResult]) -> None:
    assert measured("adaptive") == modes["adaptive"]


def test_the_command_runs_on_the_virtual_clock(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--runs", "4", "--rate", "16", "--knee", "2", "--hard-limit", "4", "--fixed", "4", "--virtual"]) == 0
    assert "(b) adaptive window" in capsys.readouterr().out
