"""Crash tests' child processes: ``planweave`` started in another process, SIGKILLed at a moment the journal shows."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from planweave.core.state import RunState
from tests.cli.test_cli import journal_view, subprocess_env

ROOT = str(Path(__file__).resolve().parents[2])


def env_with_root(**extra: str) -> dict[str, str]:
    """``subprocess_env()`` and ``extra``, with the repository root first on PYTHONPATH (for ``--tools tests.X:Y``)."""
    variables = {**subprocess_env(), **extra}
    variables["PYTHONPATH"] = os.pathsep.join([ROOT, variables["PYTHONPATH"]])
    return variables


def sigkill_when(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], url: str, run_id: str,
                 ready: Callable[[RunState], bool], never: str) -> None:
    """Start ``argv`` and SIGKILL it once the journal ``url`` (polled: another process writes it) shows run
    ``run_id`` in a state where ``ready`` holds; fail with ``never`` if that takes more than 60 s, and if the process
    ends before. The kill is SIGKILL: no handler runs, nothing more reaches the journal."""
    with subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, never
                assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
                seen = journal_view(url, run_id)
                if seen is not None and seen.state is not None and ready(seen.state):
                    break
                time.sleep(0.02)
            proc.kill()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert proc.returncode == -9
