"""``planweave rollouts run CONFIG.yaml`` against a scripted server (in a thread of the test): trajectories in the
config's sink; a bad config is one message naming the file and the field, exit 2."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planweave.cli.main import build_app
from planweave.rollouts.sinks import read_jsonl
from planweave.rollouts.toy import pareto_length
from planweave.testing import ScriptedLLM, Text


@pytest.fixture
def server_url() -> Iterator[str]:
    ready: list[str] = []
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with ScriptedLLM(default=Text("ok")) as url:
            ready.append(url)
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    started.wait(10)
    yield ready[0]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    loop.close()


def test_rollouts_run_writes_every_trajectory_to_the_sink(tmp_path: Path, server_url: str) -> None:
    out = tmp_path / "out.jsonl"
    config = tmp_path / "rollouts.yaml"
    config.write_text(f"policy: {{base_url: {server_url}}}\nenv: planweave.rollouts.toy:Countdown\nepisodes: 9\n"
                      f"batch: 4\njournal: sqlite:///{tmp_path / 'r.db'}\nsink: {out}\n")
    result = CliRunner().invoke(build_app(), ["rollouts", "run", str(config)])
    assert result.exit_code == 0, result.output
    got = read_jsonl(out)
    assert sorted(t.episode for t in got) == list(range(9))
    assert [len(t.turns) for t in sorted(got, key=lambda t: t.episode)] == [pareto_length(s) for s in range(9)]


def test_a_bad_config_names_the_file_and_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("policy: {base_url: http://127.0.0.1:1/v1}\nenv: planweave.rollouts.toy:Countdown\n"
                      "episodes: 0\nsink: x.jsonl\n")
    result = CliRunner().invoke(build_app(), ["rollouts", "run", str(config)])
    assert result.exit_code == 2
    assert "bad.yaml: episodes: Input should be greater than or equal to 1" in result.output
    assert "Traceback" not in result.output
