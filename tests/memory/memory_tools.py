"""Tools for the memory CLI tests (``--tools tests.memory.memory_tools:toolbox``)."""

from __future__ import annotations

from typing import Any

from planweave import Toolbox


async def forecast(city: str) -> dict[str, Any]:
    """The weather forecast of a city; fails for a city that does not exist."""
    if city == "atlantis":
        raise LookupError(f"no such city: {city}")
    return {"city": city, "temp": len(city) * 3}


toolbox = Toolbox()
toolbox.add(forecast, idempotent=True)


async def work(what: str, ms: int = 100) -> dict[str, Any]:
    """Do a piece of the task (``what``); ``ms`` is ignored here."""
    return {"done": what}


toolbox.add(work, idempotent=True)
