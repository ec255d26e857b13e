"""The durable journals a control run is resumed from: SQLite and PostgreSQL (the journal conformance backends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.journal.conftest import _make as make_backend


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    for backend in make_backend(request.param, tmp_path):
        yield backend.url
