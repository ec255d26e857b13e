"""``planweave show`` reports how a run speculated: ``--json`` carries the ``speculation`` summary of the read model
(started, adopted, discarded by reason, extra model calls, tokens and cost, the adopted attempts' head start) and
the human view prints it on one line, only when something speculated. The run is made on the virtual clock (exact
times), the CLI reads it in process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from planweave import Engine, VirtualClock, run_virtual
from planweave.cli.main import app
from planweave.journal import open_journal

# b starts at 0 on a's prediction and ends at 4, a ends at 10: adopted, 4 s ahead. d starts on c's wrong prediction
# and is thrown away when c ends (mismatch); its real attempt runs after c.
PLAN = {"steps": [
    {"id": "a", "tool": "sleep", "args": {"seconds": 10, "result": {"t": 1}}, "predict": {"t": 1}},
    {"id": "b", "tool": "sleep", "args": {"seconds": 4, "result": "${a.t}"}},
    {"id": "c", "tool": "sleep", "args": {"seconds": 20, "result": {"u": 2}}, "predict": {"u": 3}},
    {"id": "d", "tool": "sleep", "args": {"seconds": 1, "result": "${c.u}"}},
]}


def made(url: str, speculate: str) -> None:
    async def go() -> None:
        async with open_journal(url) as journal, Engine(journal, clock=VirtualClock()) as engine:
            run = await engine.start(PLAN, run_id="r1", speculation=speculate)  # type: ignore[arg-type]
            result = await asyncio.wait_for(run.wait(), 600)
            assert result.ok, result.error

    run_virtual(go())


def invoke(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "PLANWEAVE_JOURNAL": None}).invoke(app, list(args))


def test_show_reports_what_speculation_started_adopted_discarded_and_saved(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    made(url, "safe")
    shown = invoke("show", "r1", "--journal", url, "--json")
    assert shown.exit_code == 0, shown.output
    spec = json.loads(shown.stdout)["speculation"]
    assert spec == {"started": 2, "adopted": 1, "discarded": 1, "discarded_by_reason": {"mismatch": 1},
                    "interrupted": 0, "extra_cost_usd": 0.0, "extra_model_calls": 0, "extra_tokens": 0,
                    "extra_calls_cost_usd": 0.0, "total_extra_cost_usd": 0.0, "head_start_s": pytest.approx(4.0)}
    human = invoke("show", "r1", "--journal", url)
    assert human.exit_code == 0, human.output
    (line,) = [ln for ln in human.stdout.splitlines() if ln.startswith("speculation:")]
    assert line == ("speculation: 2 started · 1 adopted · 1 discarded (mismatch 1) · 0 extra model calls, 0 tokens"
                    " · $0.0000 extra · 4.00s head start")


def test_show_prints_no_speculation_line_for_a_run_that_did_not_speculate(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    made(url, "off")
    shown = invoke("show", "r1", "--journal", url, "--json")
    assert shown.exit_code == 0, shown.output
    assert "speculation" not in json.loads(shown.stdout)
    human = invoke("show", "r1", "--journal", url)
    assert human.exit_code == 0 and "speculation:" not in human.stdout, human.output
