"""``planweave serve --no-cache``: the server's runs reuse no cached output (each step's tool is called), while a
server without it serves the second identical run from the cache. Real server processes on SQLite."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx

from tests.server.conftest import TOKEN
from tests.server.test_limits import finished_over_http

REPO = Path(__file__).resolve().parents[2]
TOOLS = "tests.engine.test_result_cache_cli:toolbox"  # square: cacheable, a line in its log per real call


async def calls_of_two_runs(tmp_path: Path, name: str, *flags: str) -> tuple[int, list[str]]:
    log = tmp_path / f"{name}.log"
    plan = {"steps": [{"id": "a", "tool": "square", "args": {"x": 3, "log": str(log)}},
                      {"id": "b", "tool": "square", "args": {"x": "${a.y}", "log": str(log)}}]}
    env = {**{k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}, "PLANWEAVE_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal",
        f"sqlite:///{tmp_path / (name + '.db')}", "--tools", TOOLS, *flags, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    statuses = []
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = re.search(r"serving (http://\S+)", first)
        assert url is not None, first
        async with httpx.AsyncClient(base_url=url.group(1), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            for _ in range(2):  # one after the other: the second may reuse the first's outputs
                accepted = await client.post("/runs", json={"plan": plan})
                assert accepted.status_code == 201, accepted.text
                statuses.append((await finished_over_http(client, accepted.json()["run_id"]))["status"])
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    return len(log.read_text().splitlines()), statuses


async def test_serve_no_cache_calls_every_step_and_without_it_the_second_run_is_cached(tmp_path: Path) -> None:
    cached, statuses = await calls_of_two_runs(tmp_path, "cached")
    assert statuses == ["succeeded", "succeeded"]
    assert cached == 2  # the second run called nothing
    uncached, statuses = await calls_of_two_runs(tmp_path, "uncached", "--no-cache")
    assert statuses == ["succeeded", "succeeded"]
    assert uncached == 4
