"""Sync tools for ``isolation: process`` tests: top-level functions of an importable module, as a worker needs."""

from __future__ import annotations

import os
import sys
import time


def stuck(seconds: float, pidfile: str) -> None:
    """Write this process's pid to ``pidfile``, then sleep ``seconds`` (ignoring any cancellation)."""
    with open(pidfile, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)


def whoami(tag: str) -> dict[str, object]:
    return {"pid": os.getpid(), "tag": tag}


def fails(message: str) -> None:
    raise ValueError(message)


def exits() -> None:
    sys.exit(5)


def dies() -> None:
    os._exit(9)


def unsendable() -> object:
    return lambda: None  # a result that cannot be pickled back
