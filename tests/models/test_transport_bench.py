"""benchmarks/transport_bench.py measures what docs/models.md says it does: both transports stream every dialect
under planweave's admission, and the SSE edge cases are reported as they happen (run small here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from planweave.testing import ScriptedLLM, Text

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "transport_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transport_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["transport_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_both_transports_stream_the_dialect_and_report_their_figures(bench: ModuleType, dialect: str) -> None:
    async with ScriptedLLM(default=Text(" ".join(f"w{i}" for i in range(32)))) as base_url:
        for transport in ("httpx", "sdk"):
            figures = await bench.timings(dialect, transport, base_url, 3)
            assert 0 < figures["ttft_ms_p50"] <= figures["call_ms_p50"] and figures["cpu_ms_per_call"] > 0


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_a_cut_stream_is_an_error_in_both_transports_charged_what_was_billed(bench: ModuleType,
                                                                                   dialect: str) -> None:
    ours = await bench.edge_case(dialect, "httpx", bench.EDGES["cut stream"]())
    theirs = await bench.edge_case(dialect, "sdk", bench.EDGES["cut stream"]())
    assert ours["error"] == "ModelUnavailable" and theirs["error"] == "APIConnectionError"
    for seen in (ours, theirs):
        assert seen["billed_tokens"] > 0 and 0 <= seen["charged_tokens"] - seen["billed_tokens"] <= 1
