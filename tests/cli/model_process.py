"""The scripted model server as its own process, for the CLI tests that run planweave in other processes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.cli.test_cli import cli_command, subprocess_env


@contextmanager
def scripted_model(script: Path, plans: list[list[dict[str, Any]]], answer: str = "done") -> Iterator[str]:
    """A scripted model server process (its base URL): its first calls write ``plans`` in turn (the script, written
    to the file ``script``), every later one answers ``{"answer": answer}``; killed on leaving the block."""
    script.write_text("".join(json.dumps({"plan": plan}) + "\n" for plan in plans))
    proc = subprocess.Popen(
        [*cli_command()[:2], "planweave.testing.scripted_llm", "--port", "0", "--script", str(script),
         "--text", json.dumps({"answer": answer})],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "scripted LLM server at http://127.0.0.1:PORT/v1 (...)"
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.kill()
        proc.communicate()
