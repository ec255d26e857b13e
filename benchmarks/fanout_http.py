"""Fan out N ``http.get`` steps to a local ``python3 -m http.server``, through ``planweave run`` as a user would.

Prints the wall time of the ``planweave run`` process, its peak RSS (from ``wait4``), and how many steps succeeded
and failed. The steps share the toolbox's pooled client (at most 64 connections); the engine runs at most 64 steps
at once unless ``--concurrency`` says otherwise. Target: every step succeeds, under 500 MB peak RSS.

    .venv/bin/python benchmarks/fanout_http.py [--steps 5000] [--concurrency N] [--journal URL]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until_serving(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 10.0) -> None:
    """Poll the server (bounded) until it answers: it is another process, so nothing here could be awaited."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the HTTP server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the HTTP server at {url} did not answer within {deadline_s:g}s")


def write_plan(path: Path, url: str, steps: int) -> None:
    plan = {"name": "fanout-http", "on_failure": "continue",
            "steps": [{"id": f"get{i}", "tool": "http.get", "args": {"url": url}} for i in range(steps)]}
    path.write_text(json.dumps(plan), encoding="utf-8")


def run_cli(args: list[str], cwd: Path) -> tuple[int, float, float, str, str]:
    """Run ``planweave`` with ``args``; return (exit code, wall seconds, peak RSS in MB, stdout, stderr)."""
    out_path, err_path = cwd / "stdout.json", cwd / "stderr.txt"
    started = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "planweave.cli.main", *args], cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (proc.returncode, wall, usage.ru_maxrss / 1024, out_path.read_text(encoding="utf-8"),
            err_path.read_text(encoding="utf-8", errors="replace"))


def summarise(stdout: str) -> dict[str, Any]:
    try:
        report = json.loads(stdout)
    except ValueError:
        return {"status": "no JSON on stdout", "counts": {}}
    counts = Counter(step["status"] for step in report.get("steps", {}).values())
    return {"status": report.get("status"), "counts": dict(counts)}


@dataclass(frozen=True)
class FanoutOptions:
    steps: int
    concurrency: int | None
    journal: str | None


def _options(
    steps: Annotated[int, typer.Option(min=1, help="http.get steps in the fan-out")] = 5000,
    concurrency: Annotated[int | None, typer.Option(min=1, help="passed to planweave run (default: its own)")] = None,
    journal: Annotated[str | None, typer.Option(help="journal URL (default: a SQLite file in a temp dir)")] = None,
) -> FanoutOptions:
    """Fan out http.get steps to a local python3 -m http.server through `planweave run`."""
    return FanoutOptions(steps, concurrency, journal)


def main(argv: list[str] | None = None) -> int:
    opts = parse_command_line(_options, argv, "python benchmarks/fanout_http.py")
    with tempfile.TemporaryDirectory(prefix="planweave-fanout-") as tmp:
        root = Path(tmp)
        (root / "www").mkdir()
        (root / "www" / "hello.txt").write_text("hello\n", encoding="utf-8")
        port = free_port()
        url = f"http://127.0.0.1:{port}/hello.txt"
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                   "--directory", str(root / "www")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_until_serving(url, server)
            write_plan(root / "plan.json", url, opts.steps)
            args = ["run", str(root / "plan.json"), "--json", "--journal",
                    opts.journal or f"sqlite:///{root / 'runs.db'}"]
            if opts.concurrency is not None:
                args += ["--concurrency", str(opts.concurrency)]
            code, wall, rss_mb, stdout, stderr = run_cli(args, root)
        finally:
            server.terminate()
            server.wait(10)
    seen = summarise(stdout)
    print(f"fan-out of {opts.steps} http.get steps to python3 -m http.server "
          f"(concurrency: {opts.concurrency or 'planweave default'})")
    print(f"  exit code        {code} (run {seen['status']})")
    print(f"  wall time        {wall:.2f} s")
    print(f"  peak RSS         {rss_mb:.0f} MB")
    print(f"  succeeded        {seen['counts'].get('succeeded', 0)}")
    print(f"  failed           {seen['counts'].get('failed', 0)}")
    others = {k: v for k, v in seen["counts"].items() if k not in ("succeeded", "failed")}
    if others:
        print(f"  other states     {others}")
    if code not in (0, 1):
        print(stderr[-2000:], file=sys.stderr)
    ok = code == 0 and seen["counts"].get("succeeded", 0) == opts.steps and rss_mb < 500
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
