"""Forecasts: estimates fitted from a journal's history, and Monte Carlo simulations of the rest of a plan.

``estimates`` (pure: fitting), ``history`` (reads a journal into the estimates table), ``simulate`` (pure: the
forecast), ``live`` (refreshes a running run's forecast and journals it). See docs/forecast.md.
"""

from __future__ import annotations

from planweave.forecast.estimates import BetaRate, Duration, Estimate, Estimates, Observation, StepModel, fit
from planweave.forecast.simulate import Forecast, Quantiles, forecast

__all__ = ["BetaRate", "Duration", "Estimate", "Estimates", "Forecast", "Observation", "Quantiles", "StepModel",
           "fit", "forecast"]
