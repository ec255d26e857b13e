"""Session-wide test settings: the header says which build of the engine the suite runs against."""

from __future__ import annotations

import planweave.engine.runtime as runtime
from planweave.engine import COMPILED


def pytest_report_header() -> str:
    build = "compiled with mypyc (scripts/test-compiled.sh)" if COMPILED else "pure Python"
    return f"planweave engine: {build}, from {runtime.__file__}"
