"""Example tools for `planweave goal ... --tools examples.weather:toolbox` (offline, deterministic data)."""

from __future__ import annotations

import asyncio
import hashlib

from planweave import Toolbox, builtin_tools

toolbox: Toolbox = builtin_tools()


@toolbox.tool(idempotent=True)
async def forecast(city: str, day: str = "tomorrow") -> dict[str, object]:
    """Weather forecast for a city: temperature in °C, rain probability and a one-word summary."""
    await asyncio.sleep(0.2)  # pretend to call a weather service
    seed = int(hashlib.sha256(f"{city.lower()}/{day}".encode()).hexdigest()[:8], 16)
    temp = 8 + seed % 20
    rain = (seed // 20) % 100
    return {"city": city, "day": day, "temp_c": temp, "rain_pct": rain,
            "summary": "rainy" if rain > 60 else "cloudy" if rain > 30 else "sunny"}


@toolbox.tool(idempotent=True)
async def compare(a: dict[str, object], b: dict[str, object]) -> dict[str, object]:
    """Recommend the better of two forecasts: warmer and drier wins."""
    def score(f: dict[str, object]) -> float:
        return float(f["temp_c"]) - 0.2 * float(f["rain_pct"])  # type: ignore[arg-type]

    best = a if score(a) >= score(b) else b
    return {"recommend": best["city"], "because": f"{best['temp_c']}°C, {best['rain_pct']}% rain"}
