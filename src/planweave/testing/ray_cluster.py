"""A Ray cluster on this machine, started the way users start one (``ray start --head``) and stopped by its own pids.

Test and benchmark infrastructure. ``ray stop`` would stop every Ray of the user on the machine (other sessions'
clusters too), so :meth:`LocalRayCluster.stop` ends only the processes this cluster started: those whose command
line names its own temporary directory, and their descendants (the workers, renamed ``ray::...``). Every port is
chosen free (the head's default, 6379, is Redis's). Token authentication is off for it (``RAY_AUTH_MODE=disabled``,
which the driver must use too: :attr:`LocalRayCluster.env`). The address is the one Ray reports (it advertises the
machine's interface address, not 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

STOP_GRACE_S = 3.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ray_command() -> str:
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else (shutil.which("ray") or "ray")


class LocalRayCluster:
    """``ray start --head --num-cpus N`` in a temporary directory of its own; a context manager."""

    def __init__(self, num_cpus: int = 2, *, resources: str | None = None, start_timeout: float = 90.0) -> None:
        self.num_cpus = num_cpus
        self.resources = resources
        self.start_timeout = start_timeout
        self.temp_dir = ""
        self.address = ""
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

    def start(self) -> str:
        """Start the head node; return its address (``host:port``, as Ray reports it)."""
        self.temp_dir = tempfile.mkdtemp(prefix="pw-ray-")  # short: Ray's socket paths must stay under 108 bytes
        command = [_ray_command(), "start", "--head", f"--num-cpus={self.num_cpus}", f"--temp-dir={self.temp_dir}",
                   f"--port={_free_port()}",
                   f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
                   "--include-dashboard=false", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
        if self.resources:
            command.append(f"--resources={self.resources}")
        try:
            proc = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=self.start_timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"ray start did not finish in {self.start_timeout}s") from None
        reported = Path(self.temp_dir, "ray_current_cluster")
        if proc.returncode != 0 or not reported.exists():
            self.stop()
            raise RuntimeError(f"ray start failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        self.address = reported.read_text().strip()
        return self.address

    def own_pids(self) -> list[int]:
        """This cluster's processes: those naming its temp dir, then all their descendants."""
        if not self.temp_dir:
            return []
        parents: dict[int, int] = {}
        roots: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            pid = int(entry.name)
            parents[pid] = ppid
            if self.temp_dir in cmdline and pid != os.getpid():
                roots.append(pid)
        found = set(roots)
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if ppid in found and pid not in found:
                    found.add(pid)
                    grew = True
        return sorted(found)

    def stop(self) -> None:
        """End this cluster's processes (SIGTERM, then SIGKILL) and remove its temp dir."""
        pids = self.own_pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p)]
                time.sleep(0.05)
            if not pids:
                break
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
