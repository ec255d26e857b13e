"""Driving a planweave server from tests and benchmarks: reading its event streams, and simple plans to submit.

Test and benchmark infrastructure (``tests/server``, ``benchmarks/server_load.py``), like :mod:`scripted_llm`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


async def read_sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The ``text/event-stream`` frames of ``response`` as ``{"id", "event", "data"}`` dicts, ``data`` parsed as JSON
    (lines of one frame's ``data`` joined by newlines, as the format says); comment lines (``: ping``) skipped."""
    frame: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in frame:
                frame["data"] = json.loads(frame["data"])
                yield frame
            frame = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data" and "data" in frame:
            frame["data"] += "\n" + value
        else:
            frame[name] = value


def chain_plan(n: int, seconds: float = 0.05, prefix: str = "s") -> dict[str, Any]:
    """A plan of ``n`` ``sleep`` steps of ``seconds`` each, each after the previous one (``s0``, ``s1``, ...)."""
    steps: list[dict[str, Any]] = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"{prefix}{i}", "tool": "sleep", "args": {"seconds": seconds}}
        if i:
            step["after"] = [f"{prefix}{i - 1}"]
        steps.append(step)
    return {"steps": steps}
