"""Build hook: with ``PLANWEAVE_COMPILE=1`` the engine's hot path is compiled with mypyc; otherwise pure Python.

The compiled modules are the same typed source (``mypy --strict`` clean), built as C extensions: a no-op step costs
about a quarter less (docs/benchmarks.md, "A compiled engine"). Opt-in, as black does with mypyc: an editable install
would otherwise shadow the sources with stale extensions, and a pure build needs no C compiler. mypy (which brings
mypyc) and a C compiler must be in the build environment:

    PLANWEAVE_COMPILE=1 pip wheel --no-build-isolation --no-deps -w dist .
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

# The modules a step goes through, and nothing that imports an optional library. Each must stay compilable:
# mypyc turns their classes into native ones (no monkeypatching, no new attributes, annotations enforced).
COMPILED = [
    "src/planweave/engine/attempt.py",
    "src/planweave/engine/dispatch.py",
    "src/planweave/engine/runtime.py",
    "src/planweave/engine/scheduler.py",
    "src/planweave/engine/state.py",
]

ext_modules = []
if os.environ.get("PLANWEAVE_COMPILE") == "1":
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("PLANWEAVE_COMPILE=1 needs mypyc in the build environment: pip install mypy, then build with "
                 "--no-build-isolation")
    ext_modules = mypycify(COMPILED, opt_level="3", group_name="planweave_engine")  # its runtime: planweave_engine__mypyc

setup(ext_modules=ext_modules)
