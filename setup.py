"""Build hook: a pure-Python build (the metadata is in pyproject.toml).

The engine was once optionally compiled with mypyc (``PLANWEAVE_COMPILE=1``, about a quarter fewer instructions per
no-op step); the pure build is the product now (issue 28: the compiled pass cost every CI run ~8 minutes and bound the
busiest files to what mypyc compiles, for microseconds no agent's seconds-long steps notice). docs/benchmarks.md, "A
compiled engine", keeps the measurements.
"""

from __future__ import annotations

from setuptools import setup

setup()
