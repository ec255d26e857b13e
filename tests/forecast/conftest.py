"""Forecast tests use the engine tests' journals: every implementation (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

from tests.engine.conftest import journal_at

__all__ = ["journal_at"]
