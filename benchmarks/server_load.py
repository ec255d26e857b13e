"""Load a real ``planweave serve`` on 127.0.0.1, SIGKILL it mid-load, restart it, and check that nothing was lost.

N clients each submit runs (``POST /runs`` with their own run ids, retried across the outage) and follow every run's
event stream to its end, reconnecting with ``Last-Event-ID`` whenever the connection drops. While they do, the
server is killed with SIGKILL and started again on the same port and journal (it resumes the interrupted runs).
Afterwards the journal itself is read and compared with what the clients saw:

- no run lost: every run a client submitted is in the journal and succeeded;
- every event seen exactly once: per run, the (position, kind, step) triples the clients received across their
  reconnects are exactly the journal's events, none twice, none missing, none that the journal does not hold.

It prints a table (requests, latency p50/p99 of ``POST /runs``, reconnects, lost / duplicated / phantom events, runs
resumed). Loopback only, bounded in count and time (``--timeout``, default 55 s); exit 1 if a check fails.

    .venv/bin/python benchmarks/server_load.py [--clients 8] [--runs 4] [--steps 5] [--kill-after-events 60] [--json]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from planweave.bench.cli import parse_command_line
from planweave.testing.server import chain_plan, read_sse

TOKEN = "server-load-benchmark-token-0123456789"
Seen = tuple[int, str, str | None]  # (journal position, event kind, step)


@dataclass
class Figures:
    """What the clients did and saw."""

    requests: int = 0  # every POST /runs sent, retries included
    latencies: list[float] = field(default_factory=list)  # of the POSTs that got an answer
    drops: int = 0  # streams that ended or broke before their run_finished
    reconnects: int = 0  # streams resumed with Last-Event-ID (200 after a drop)
    failed_connects: int = 0  # attempts while the server was down
    accepted: list[str] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)  # POST /runs outcomes: status code or transport error
    seen: dict[str, list[Seen]] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)
    kills: int = 0
    kill_at: int = 0  # the SIGKILL comes once the clients have seen this many events (mid-load, not by the clock)
    loaded: asyncio.Event = field(default_factory=asyncio.Event)

    def saw(self, run_id: str, item: Seen) -> None:
        self.seen.setdefault(run_id, []).append(item)
        if item[1] != "run_finished" and sum(len(v) for v in self.seen.values()) >= self.kill_at:
            self.loaded.set()  # set while this run is mid-stream


# -- the server process -------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """``planweave serve`` as a subprocess: started, killed and restarted on one port and journal."""

    def __init__(self, port: int, journal: str, workdir: Path) -> None:
        self.port = port
        self.journal = journal
        self.workdir = workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 30.0) -> list[str]:
        """Start it and wait until it has said where it serves; return the runs it resumed at startup."""
        self.lines = []
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "planweave.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
            "--journal", self.journal, cwd=self.workdir, env={**os.environ, "PLANWEAVE_TOKEN": TOKEN},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
        )
        announced = asyncio.Event()
        self._reader = asyncio.create_task(self._read(announced))
        await asyncio.wait_for(announced.wait(), timeout)
        await asyncio.sleep(0.05)  # the optional "resumed ..." line follows the token line at once
        resumed = [line.split(":", 1)[1] for line in self.lines if line.startswith("resumed interrupted runs:")]
        return [r.strip() for r in resumed[0].split(",")] if resumed else []

    async def _read(self, announced: asyncio.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().rstrip()
            self.lines.append(line)
            if line.startswith("access token"):
                announced.set()
        announced.set()

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; what the journal holds is what a crash leaves."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                await self.kill()
        if self._reader is not None:
            await asyncio.wait([self._reader], timeout=5)


# -- the clients --------------------------------------------------------------------------------------------------
RETRYABLE = (httpx.TransportError, httpx.RemoteProtocolError)


async def submit(client: httpx.AsyncClient, run_id: str, plan: dict[str, Any], figures: Figures) -> None:
    """POST the run until the server has it: a 409 after a lost answer means an earlier attempt created it."""
    while True:
        figures.requests += 1
        began = time.perf_counter()
        try:
            resp = await client.post("/runs", json={"plan": plan, "run_id": run_id})
        except RETRYABLE as exc:
            figures.answers[type(exc).__name__] += 1
            await asyncio.sleep(0.1)
            continue
        figures.answers[str(resp.status_code)] += 1
        figures.latencies.append(time.perf_counter() - began)
        if resp.status_code == 201 or (resp.status_code == 409 and "already in the journal" in resp.text):
            figures.accepted.append(run_id)
            return
        if resp.status_code >= 500:
            await asyncio.sleep(0.1)
            continue
        raise SystemExit(f"POST /runs {run_id}: {resp.status_code} {resp.text}")


async def follow(client: httpx.AsyncClient, run_id: str, figures: Figures) -> None:
    """Read the run's events to its run_finished, resuming after the last id seen whenever the stream drops."""
    last = 0
    dropped = False
    while True:
        headers = {"Last-Event-ID": str(last)} if last else {}
        try:
            async with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as resp:
                if resp.status_code != 200:
                    raise httpx.TransportError(f"status {resp.status_code}")
                figures.reconnects += dropped
                dropped = False
                async for frame in read_sse(resp):
                    last = int(frame["id"])
                    figures.saw(run_id, (last, frame["event"], frame["data"].get("step")))
                    if frame["event"] == "run_finished":
                        return
        except RETRYABLE:
            if dropped:
                figures.failed_connects += 1
        if not dropped:
            figures.drops += 1  # the stream ended or broke before run_finished
        dropped = True
        await asyncio.sleep(0.1)


async def client_loop(index: int, url: str, runs: int, plan: dict[str, Any], figures: Figures) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=httpx.Timeout(10.0, read=30.0)) as client:
        for n in range(runs):
            run_id = f"load-{index}-{n}"
            await submit(client, run_id, plan, figures)
            await follow(client, run_id, figures)


async def crash_and_restart(server: ServerProcess, figures: Figures) -> None:
    await figures.loaded.wait()
    await server.kill()
    figures.kills += 1
    figures.resumed = await server.start()


# -- the checks ---------------------------------------------------------------------------------------------------
async def journal_truth(url: str, run_ids: list[str]) -> tuple[dict[str, list[Seen]], dict[str, str]]:
    """Each run's events (position, kind, step) and final status, read from the journal itself."""
    from planweave.core.state import RunState
    from planweave.journal import open_journal

    events: dict[str, list[Seen]] = {}
    status: dict[str, str] = {}
    async with open_journal(url) as journal:
        for run_id in run_ids:
            stored = await journal.read(run_id)
            events[run_id] = [(e.pos or 0, e.kind, e.step) for e in stored]
            status[run_id] = RunState.from_events(run_id, stored).status if stored else "missing"
    return events, status


def compare(figures: Figures, truth: dict[str, list[Seen]], status: dict[str, str]) -> dict[str, Any]:
    lost = duplicated = phantom = 0
    for run_id, stored in truth.items():
        seen = Counter(figures.seen.get(run_id, []))
        journal = Counter(stored)
        lost += sum((journal - seen).values())
        duplicated += sum(n - 1 for n in seen.values() if n > 1)
        phantom += sum(1 for item in seen if item not in journal)
    latencies = sorted(figures.latencies)
    return {
        "clients_runs": len(figures.accepted),
        "requests": figures.requests,
        "answers": dict(figures.answers),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
        "drops": figures.drops,
        "reconnects": figures.reconnects,
        "failed_connects": figures.failed_connects,
        "events": sum(len(v) for v in truth.values()),
        "lost_events": lost,
        "duplicated_events": duplicated,
        "phantom_events": phantom,
        "runs_lost": sum(1 for s in status.values() if s == "missing"),
        "runs_not_succeeded": sorted(r for r, s in status.items() if s not in ("succeeded", "missing")),
        "runs_resumed": len(figures.resumed),
        "kills": figures.kills,
    }


async def main_async(args: LoadOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="planweave-load-") as tmp:
        journal = args.journal or f"sqlite:///{Path(tmp) / 'runs.db'}"
        server = ServerProcess(free_port(), journal, Path(tmp))
        figures = Figures(kill_at=args.kill_after_events)
        began = time.perf_counter()
        await server.start()
        try:
            async with asyncio.timeout(args.timeout):
                plan = chain_plan(args.steps, args.step_seconds)
                clients = [client_loop(i, server.url, args.runs, plan, figures) for i in range(args.clients)]
                await asyncio.gather(crash_and_restart(server, figures), *clients)
        finally:
            await server.stop()
        elapsed = time.perf_counter() - began
        submitted = [f"load-{i}-{n}" for i in range(args.clients) for n in range(args.runs)]
        truth, status = await journal_truth(journal, submitted)
    result = compare(figures, truth, status)
    result["seconds"] = round(elapsed, 2)
    return result


def table(result: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f} ms"

    rows = [
        ("runs submitted", str(result["clients_runs"])),
        ("POST /runs requests (with retries)", str(result["requests"])),
        ("POST /runs answers", ", ".join(f"{k}: {v}" for k, v in sorted(result["answers"].items()))),
        ("POST /runs latency p50 / p99", f"{ms(result['p50_ms'])} / {ms(result['p99_ms'])}"),
        ("SIGKILLs of the server", str(result["kills"])),
        ("runs resumed by the restarted server", str(result["runs_resumed"])),
        ("streams dropped / resumed with Last-Event-ID", f"{result['drops']} / {result['reconnects']}"),
        ("connection attempts while the server was down", str(result["failed_connects"])),
        ("events in the journal", str(result["events"])),
        ("events lost / duplicated / phantom", f"{result['lost_events']} / {result['duplicated_events']} / "
                                               f"{result['phantom_events']}"),
        ("runs lost / not succeeded", f"{result['runs_lost']} / {len(result['runs_not_succeeded'])}"),
        ("wall time", f"{result['seconds']:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def ok(result: dict[str, Any]) -> bool:
    return not (result["lost_events"] or result["duplicated_events"] or result["phantom_events"]
                or result["runs_lost"] or result["runs_not_succeeded"])


@dataclass(frozen=True)
class LoadOptions:
    """What load to put on the server (the command line's options)."""

    clients: int = 8
    runs: int = 4
    steps: int = 5
    step_seconds: float = 0.1
    kill_after_events: int = 60
    timeout: float = 55.0
    journal: str | None = None
    json: bool = False


def _options(  # one parameter per option, read by Typer
    clients: Annotated[int, typer.Option(min=1, help="concurrent clients")] = 8,
    runs: Annotated[int, typer.Option(min=1, help="runs per client, one after the other")] = 4,
    steps: Annotated[int, typer.Option(min=1, help="sleep steps per run, in a chain")] = 5,
    step_seconds: Annotated[float, typer.Option(help="seconds each step sleeps")] = 0.1,
    kill_after_events: Annotated[int, typer.Option(
        help="SIGKILL the server once the clients have seen this many events")] = 60,
    timeout: Annotated[float, typer.Option(help="the whole load is cut off after this")] = 55.0,
    journal: Annotated[str | None, typer.Option(
        help="journal URL (default: a SQLite file in a temporary directory)")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> LoadOptions:
    """Load a `planweave serve`, SIGKILL it mid-load and restart it: no run and no streamed event may be lost."""
    if clients * runs > 1000:
        raise typer.BadParameter("at most 1000 runs in all (--clients x --runs): the load must stay bounded",
                                 param_hint="--clients/--runs")
    return LoadOptions(clients, runs, steps, step_seconds, kill_after_events, timeout, journal, json_output)


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(_options, argv, "python benchmarks/server_load.py")
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0 if ok(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
