"""benchmarks/server_load.py in small: a SIGKILLed `planweave serve` loses no run and no event of its streams."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "server_load.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("server_load", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def test_a_killed_server_loses_no_run_and_no_streamed_event() -> None:
    bench = load()
    args = argparse.Namespace(clients=3, runs=2, steps=4, step_seconds=0.15, kill_after_events=12, timeout=50.0,
                              journal=None)
    result = await bench.main_async(args)
    assert result["kills"] == 1
    assert result["runs_resumed"] >= 1 and result["reconnects"] >= 1, result  # the kill hit runs mid-stream
    assert (result["lost_events"], result["duplicated_events"], result["phantom_events"]) == (0, 0, 0), result
    assert result["runs_lost"] == 0 and result["runs_not_succeeded"] == [], result
    assert bench.ok(result)
